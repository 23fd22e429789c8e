# sparrow - one readable GNU Makefile, out-of-tree builds.
#
#   make              build/sparrow and build/libsparrow.a, the library behind include/sparrow.h (release, -O2)
#   make test         unit tests + CLI tests, closing with "N passed, N failed"
#   make asan         the same tests under AddressSanitizer + UBSan (build/asan/)
#   make fuzz         libFuzzer targets (clang) in build/fuzz/
#   make bench        benchmarks in bench/ (speed is asserted there, never in tests)
#   make demo         generate a tiny model and run sparrow on it
#   make deps         install missing Debian packages (needs root)
#   make CUDA=1       also build the CUDA backend (needs nvcc), in build/cuda/
#   make cuda-check   the CUDA build's library, CLI and GPU tests compiled where nvcc is
#                     (they skip their GPU cases on a machine without one)

CUDA ?= 0
CUDA_HOME ?= /usr/local/cuda
ifndef NVCC
NVCC := $(shell command -v nvcc 2>/dev/null || echo $(CUDA_HOME)/bin/nvcc)
endif
# The CUDA build keeps its own objects: every file sees -DSP_CUDA=1.
ifeq ($(CUDA),1)
BUILD ?= build/cuda
endif
BUILD ?= build
CC ?= cc
SAN ?= 0

WARN := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wno-unused-parameter
OPT ?= -O2 -g
# Extra instrumentation (sanitizers, fuzzer hooks) for every object and link.
INSTR ?=
ifeq ($(SAN),1)
OPT := -O1 -g -fno-omit-frame-pointer
INSTR := -fsanitize=address,undefined -fno-sanitize-recover=undefined
endif
CFLAGS := $(OPT) $(INSTR) -std=c11 $(WARN) -D_GNU_SOURCE -fno-strict-aliasing -pthread -Iinclude -Isrc -MMD -MP
LDFLAGS += $(INSTR)
LDLIBS := -lcjson -lpcre2-8 -lutf8proc -luring -lmicrohttpd -lm -lpthread

# Hopper machine code plus PTX that newer GPUs compile at load.
CUDA_ARCH ?= -gencode=arch=compute_90,code=[sm_90,compute_90]
ifeq ($(CUDA),1)
CFLAGS += -DSP_CUDA=1 -isystem $(CUDA_HOME)/include
NVCCFLAGS ?= -O2 -g -std=c++17 $(CUDA_ARCH) -Isrc -Iinclude -Xcompiler -Wall,-Wextra,-Wno-unused-parameter -Werror all-warnings
# the runtime linked in: the binaries need only the driver where they run
LDLIBS += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
CU_SRC := $(wildcard src/backend/cuda/*.cu)
else
CUDA_OFF := src/backend/cuda/%
endif

# SIMD kernel files carry their instruction set in their name and are the only
# files built with it; everything else runs on any x86-64 (runtime dispatch).
ISA_FLAGS_avx2 := -mavx2 -mfma -mf16c
ISA_FLAGS_avxvnni := $(ISA_FLAGS_avx2) -mavxvnni
ISA_FLAGS_avx512 := $(ISA_FLAGS_avx2) -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni \
	-mprefer-vector-width=256
ISA_FLAGS_amx := $(ISA_FLAGS_avx512) -mamx-tile -mamx-int8

# SKIP: source patterns to leave out of a build (e.g. SKIP=src/tokenizer/%).
SKIP ?=
LIB_SRC := $(filter-out src/cli/% $(SKIP) $(CUDA_OFF),$(wildcard src/*/*.c src/backend/*/*.c))
CLI_SRC := $(wildcard src/cli/*.c)
TEST_SRC := $(wildcard tests/test_*.c)
TOOL_SRC := $(wildcard tools/*.c)
FUZZ_SRC := $(wildcard fuzz/fuzz_*.c)
BENCH_SRC := $(wildcard bench/*.c)

LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
LIB := $(BUILD)/libsparrow.a
BIN := $(BUILD)/sparrow
TESTS := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TOOLS := $(TOOL_SRC:tools/%.c=$(BUILD)/tools/%)
BENCHES := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all test asan fuzz bench demo deps clean format cuda-check
# Keep intermediate objects (test and tool mains) between builds.
.SECONDARY:
all: $(BIN) $(TOOLS)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(foreach isa,avx2 avxvnni avx512 amx,$(if $(findstring _$(isa).c,$<),$(ISA_FLAGS_$(isa)))) -c $< -o $@

# webui.c embeds the page with .incbin, which the compiler's dependency
# files do not list: editing the HTML rebuilds it through this line.
$(BUILD)/obj/src/server/webui.o: src/server/webui.html

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BIN): $(CLI_OBJ) $(LIB)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ -o $@ $(LDLIBS) -lcmocka

$(BUILD)/tools/%: $(BUILD)/obj/tools/%.o $(BUILD)/obj/src/cli/args.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ -o $@ $(LDLIBS)

test: $(BIN) $(TOOLS) $(TESTS)
	BUILD=$(BUILD) SAN=$(SAN) tests/run.sh $(TESTS)

asan:
	$(MAKE) BUILD=build/asan SAN=1 test

FUZZ_CC ?= clang
fuzz:
	$(MAKE) BUILD=build/fuzz-obj CC=$(FUZZ_CC) OPT="-O1 -g" INSTR="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" \
	  build/fuzz-obj/libsparrow.a
	@mkdir -p build/fuzz
	for f in $(FUZZ_SRC); do \
	  $(FUZZ_CC) -std=c11 -D_GNU_SOURCE -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	    -Iinclude -Isrc $$f build/fuzz-obj/libsparrow.a \
	    -o build/fuzz/$$(basename $$f .c) $(LDLIBS) || exit 1; \
	done
	@echo "fuzzers in build/fuzz/; run e.g. build/fuzz/fuzz_safetensors -max_total_time=600 fuzz/corpus/safetensors"

bench: $(BIN) $(BENCHES)
	bench/run.sh

demo: $(BIN) $(TOOLS)
	tools/demo.sh

deps:
	tools/install-deps.sh

cuda-check:
	@if [ -x "$(NVCC)" ] || command -v "$(NVCC)" >/dev/null 2>&1; then \
	  $(MAKE) CUDA=1 BUILD=build/cuda build/cuda/sparrow build/cuda/tests/test_backend_ops build/cuda/tests/test_forward; \
	else echo "cuda-check: no nvcc here ($(NVCC)): the CUDA build was not compiled"; fi

format:
	clang-format -i $(wildcard include/*.h src/*/*.[ch] src/backend/*/*.[ch] tests/*.[ch] tools/*.c fuzz/*.c bench/*.c)

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
