# deepinfer build.
#
#   make                 library, CLI and unit tests in build/ (gcc by default)
#   make CC=clang        the same with clang
#   make SAN=1 BUILD=build-asan CC=clang   ASan + UBSan build of everything
#   make SAN=thread BUILD=build-tsan DI_NO_CUDA=1   ThreadSanitizer build (the
#                        thread pool, the engine's overlapped steps)
#   make test            every test (see scripts/test)
#   make fuzz            libFuzzer targets in build-fuzz/ (clang)
#
# Sources are found by folder: every .c under src/ except src/cli/ goes into
# the library, src/cli/*.c into the CLI, tests/unit/test_*.c become one test
# binary each. Adding a file needs no edit here.

CC      ?= cc
BUILD   ?= build
SAN     ?= 0
OPT     ?= -O2
PKG_LIBS := -lcjson -lutf8proc -lm -lpthread -ldl

CFLAGS_COMMON := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wno-unused-parameter \
                 -Iinclude -Isrc -fPIC -pthread -g $(OPT) -fvisibility=hidden
ifeq ($(SAN),1)
CFLAGS_COMMON += -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer \
                 -DDI_SANITIZE=1
LDFLAGS_SAN := -fsanitize=address,undefined
endif
ifeq ($(SAN),thread)
CFLAGS_COMMON += -fsanitize=thread -fno-omit-frame-pointer -DDI_SANITIZE=1
LDFLAGS_SAN := -fsanitize=thread
endif
CFLAGS  += $(CFLAGS_COMMON)
LDFLAGS += $(LDFLAGS_SAN) -pthread

# CUDA backend: built whenever nvcc is on PATH (DI_NO_CUDA=1 turns it off).
NVCC      ?= $(shell command -v nvcc 2>/dev/null)
CU_SRC    := $(shell find src -name '*.cu' 2>/dev/null)
ifeq ($(DI_NO_CUDA),1)
NVCC :=
endif
ifneq ($(strip $(NVCC)),)
ifneq ($(strip $(CU_SRC)),)
HAVE_CUDA := 1
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CFLAGS    += -DDI_HAVE_CUDA=1
# -gencode (not -arch=sm_90a): wgmma needs the sm_90a target and nothing else.
NVCCFLAGS ?= -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC,-fvisibility=hidden -Iinclude -Isrc
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/targets/x86_64-linux/lib -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublas -lcublasLt
endif
endif

LIB_SRC  := $(shell find src -name '*.c' ! -path 'src/cli/*' | sort)
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
TEST_SRC := $(sort $(wildcard tests/unit/test_*.c))
TEST_HELPER_SRC := $(filter-out $(TEST_SRC),$(wildcard tests/unit/*.c))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CU_OBJ   := $(if $(HAVE_CUDA),$(CU_SRC:%.cu=$(BUILD)/obj/%.cu.o))
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_HELPER_OBJ := $(TEST_HELPER_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)

ALL_LIBS := $(PKG_LIBS) $(CUDA_LIBS)

.PHONY: all test fuzz clean run bench bench-bin
all: $(BUILD)/libdeepinfer.so $(BUILD)/libdeepinfer.a $(BUILD)/deepinfer $(TEST_BIN)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libdeepinfer.a: $(LIB_OBJ) $(CU_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libdeepinfer.so: $(LIB_OBJ) $(CU_OBJ)
	$(CC) -shared $(LDFLAGS) -o $@ $^ $(ALL_LIBS) $(if $(HAVE_CUDA),-lstdc++)

# The CLI links the static archive so it runs from any folder without
# LD_LIBRARY_PATH; the Python package and other programs use the .so.
$(BUILD)/deepinfer: $(CLI_OBJ) $(BUILD)/libdeepinfer.a
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libdeepinfer.a $(ALL_LIBS) $(if $(HAVE_CUDA),-lstdc++)

$(BUILD)/tests/%: tests/unit/%.c $(TEST_HELPER_OBJ) $(BUILD)/libdeepinfer.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -MMD -MP $< $(TEST_HELPER_OBJ) $(BUILD)/libdeepinfer.a -o $@ $(LDFLAGS) $(ALL_LIBS) $(if $(HAVE_CUDA),-lstdc++)

test:
	scripts/test

# Fuzz targets: tests/fuzz/fuzz_*.c, each linked with libFuzzer + ASan/UBSan.
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=build-fuzz/%)
FUZZ_LIB_OBJ := $(LIB_SRC:%.c=build-fuzz/obj/%.o)
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wno-unused-parameter -Iinclude -Isrc \
               -g -O1 -pthread -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -DDI_FUZZ=1
build-fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@
build-fuzz/%: tests/fuzz/%.c $(wildcard tests/fuzz/*.h) $(FUZZ_LIB_OBJ)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer $< $(FUZZ_LIB_OBJ) -o $@ $(PKG_LIBS)
fuzz: $(FUZZ_BIN)

# Benchmarks: bench/*.c, each one binary linked with the library and OpenBLAS
# (the peer most of them measure against). Run with bench/run_all.sh.
BENCH_SRC := $(sort $(wildcard bench/*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
$(BUILD)/bench/%: bench/%.c $(BUILD)/libdeepinfer.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -O3 -march=native $< $(BUILD)/libdeepinfer.a -o $@ $(LDFLAGS) $(ALL_LIBS) -lopenblas $(if $(HAVE_CUDA),-lstdc++)
bench-bin: $(BENCH_BIN)

run: all
	$(BUILD)/deepinfer run

bench: all
	bench/run_all.sh

clean:
	rm -rf build build-asan build-clang build-fuzz

# The default model's files are assembled into the library (.incbin), which
# the compiler's dependency files do not see.
$(BUILD)/obj/src/model/default_model.o build-fuzz/obj/src/model/default_model.o: $(wildcard assets/default-model/*)

-include $(shell find $(BUILD) build-fuzz -name '*.d' 2>/dev/null)
