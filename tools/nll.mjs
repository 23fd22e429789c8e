#!/usr/bin/env node
// nll.mjs - negative log-likelihood of a token sequence from the logits
// `sparrow run --dump-logits` wrote for it (float32 [tokens, vocab]):
//
//     node tools/nll.mjs LOGITS.f32 ID,ID,...   ->   "SUM COUNT"
//
// SUM is -sum over positions p < n-1 of log softmax(logits[p])[id[p+1]],
// COUNT = n - 1. Used by tests/cli/stories.sh and bench/act_precision.sh.
import fs from "node:fs";

const [file, list] = process.argv.slice(2);
if (!file || !list) {
    process.stderr.write("usage: node tools/nll.mjs LOGITS.f32 ID,ID,...\n");
    process.exit(1);
}
const ids = list.split(",").map(Number);
const buf = fs.readFileSync(file);
const logits = new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4);
const vocab = logits.length / ids.length;
if (!Number.isInteger(vocab) || ids.some((i) => !(i >= 0 && i < vocab))) {
    process.stderr.write(`nll: ${file} does not hold logits of ${ids.length} tokens over their vocabulary\n`);
    process.exit(1);
}
let sum = 0;
for (let p = 0; p + 1 < ids.length; p++) {
    const row = logits.subarray(p * vocab, (p + 1) * vocab);
    let m = -Infinity, z = 0;
    for (const v of row) m = Math.max(m, v);
    for (const v of row) z += Math.exp(v - m);
    sum += m + Math.log(z) - row[ids[p + 1]];
}
console.log(`${sum} ${ids.length - 1}`);
