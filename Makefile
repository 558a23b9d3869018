# hostir: `make run` runs the main example, `make test` runs the tests.
# A plain C toolchain suffices; CUDA is found through CUDA_HOME, else nvcc on PATH.

CC      ?= cc
CXX     ?= c++
CFLAGS  ?= -O2 -g
WARN    := -Wall -Wextra -Wpedantic
PREFIX  ?= /usr/local
BUILD   := build
LDLIBS  := -lm -lpthread

NVCC_PATH := $(shell command -v nvcc 2>/dev/null)
CUDA_HOME ?= $(if $(NVCC_PATH),$(patsubst %/bin/,%,$(dir $(NVCC_PATH))))
# With CUDA found, examples get the CUDA backend and NCCL (and still run on the
# CPU where no GPU is visible).
ifneq ($(CUDA_HOME),)
# HOSTIR_CUDA defined empty, as `#define HOSTIR_CUDA` in a source file does: both together raise no redefinition warning
CUDA_CFLAGS := -DHOSTIR_CUDA= -I$(CUDA_HOME)/include
# -Xlinker -rpath=, which cc and nvcc both take (nvcc refuses -Wl,; pkg-config drops a second -Xlinker):
# these flags also go into hostir-cuda.pc.
CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -Xlinker -rpath=$(CUDA_HOME)/lib64 -lnccl -lcublasLt -lcublas -lcudart -ldl
endif

HEADERS := hostir.h hostir_nccl.h
TEST_SRC := $(wildcard tests/*.c tests/*.h) $(wildcard tests/golden/*.txt)

.PHONY: help all run run-examples test test-asan test-tsan valgrind fuzz test-gpu test-bootstrap diff bench bench-build examples examples-nvcc install clean

all: $(BUILD)/test $(BUILD)/main

help:
	@echo 'make run            the main example (CPU ranks in one process; with CUDA found, the GPUs)'
	@echo 'make test           the tests; the last line says N passed, N failed'
	@echo 'make run-examples   every example'
	@echo 'make test-gpu       the GPU suite (TEST_GPU_STAGES=FIRST-LAST runs some of its stages)'
	@echo 'make test-asan      the tests under ASan and UBSan; test-tsan under TSan; valgrind under memcheck'
	@echo 'make diff           the differential check against a plain reference (HIR_DIFF_PROGRAMS=N)'
	@echo 'make fuzz           the fuzzer (FUZZ_SECONDS=N)'
	@echo 'make test-bootstrap the bootstrap without GPUs'
	@echo 'make bench          the benchmarks (bench-build builds them)'
	@echo 'make install        the headers and pkg-config files (PREFIX=...)'

$(BUILD):
	mkdir -p $(BUILD)

$(BUILD)/test: $(TEST_SRC) $(HEADERS) | $(BUILD)
	$(CC) -std=c11 $(WARN) $(CFLAGS) -o $@ tests/main.c $(LDLIBS)

$(BUILD)/test-asan: $(TEST_SRC) $(HEADERS) | $(BUILD)
	$(CC) -std=c11 $(WARN) -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all \
	  -fno-omit-frame-pointer -o $@ tests/main.c $(LDLIBS)

$(BUILD)/%: examples/%.c $(HEADERS) | $(BUILD)
	$(CC) $(WARN) $(CFLAGS) $(CUDA_CFLAGS) -o $@ $< $(CUDA_LDLIBS) $(LDLIBS)

$(BUILD)/test-gpu: $(filter-out tests/gpu/nvtx_probe.c,$(wildcard tests/gpu/*.c)) $(TEST_SRC) $(HEADERS) | $(BUILD)
	@test -n "$(CUDA_HOME)" || { echo "test-gpu: needs CUDA (set CUDA_HOME or put nvcc on PATH)"; exit 1; }
	$(CC) $(WARN) -Wno-unused-function -O2 -g $(CUDA_CFLAGS) -o $@ tests/gpu/main.c $(CUDA_LDLIBS) $(LDLIBS)

# hostir_nccl.h's bootstrap, without a GPU (NCCL and CUDA to link against).
$(BUILD)/test-bootstrap: tests/bootstrap/main.c $(TEST_SRC) $(HEADERS) | $(BUILD)
	@test -n "$(CUDA_HOME)" || { echo "test-bootstrap: needs CUDA and NCCL (set CUDA_HOME or put nvcc on PATH)"; exit 1; }
	$(CC) $(WARN) -Wno-unused-function -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all $(CUDA_CFLAGS) \
	  -o $@ tests/bootstrap/main.c $(CUDA_LDLIBS) $(LDLIBS)

test-bootstrap: $(BUILD)/test-bootstrap
	ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=tests/bootstrap/lsan.supp ./$(BUILD)/test-bootstrap

# An NVTX injection library that counts ranges, as Nsight Systems would see them.
$(BUILD)/nvtx_probe.so: tests/gpu/nvtx_probe.c | $(BUILD)
	$(CC) $(WARN) -O2 -shared -fPIC -I$(CUDA_HOME)/include -o $@ $< -lpthread

# Files, so that a build carried to a GPU machine is not compiled again there.
examples-nvcc: $(patsubst examples/%.c,$(BUILD)/%-nvcc,$(wildcard examples/*.c))
$(BUILD)/%-nvcc: examples/%.c $(HEADERS) | $(BUILD)
	nvcc -x cu -O2 $(CUDA_CFLAGS) -o $@ $< $(CUDA_LDLIBS) -lpthread

run: $(BUILD)/main
	./$(BUILD)/main

# The examples that run without a launcher (launch_processes wants torchrun, mpirun or srun).
run-examples: $(BUILD)/main $(BUILD)/matmul_reduce_scatter $(BUILD)/tp_dp $(BUILD)/tp_mlp $(BUILD)/host_program
	./$(BUILD)/matmul_reduce_scatter
	./$(BUILD)/tp_dp
	./$(BUILD)/tp_mlp
	./$(BUILD)/host_program > /dev/null && echo "host_program: ok"

test: $(BUILD)/test $(BUILD)/hostir_native.so
	./$(BUILD)/test

# The Python package's library for its CPU tests (python/tests, run by build/test).
$(BUILD)/hostir_native.so: python/hostir/_native.c $(HEADERS) | $(BUILD)
	$(CC) -std=c11 $(WARN) -O2 -shared -fPIC -DHOSTIR_PY_PLAIN -I. -o $@ python/hostir/_native.c $(LDLIBS)

test-asan: $(BUILD)/test-asan
	ASAN_OPTIONS=detect_leaks=1 ./$(BUILD)/test-asan

# The differential check at length: 1,000,000 random programs from a fresh seed (printed) against the
# reference (make test runs seeds 0-299; DIFF_PROGRAMS and DIFF_OFFSET change these).
DIFF_PROGRAMS ?= 1000000
DIFF_OFFSET ?= fresh
diff: $(BUILD)/test
	HIR_DIFF_PROGRAMS=$(DIFF_PROGRAMS) HIR_DIFF_OFFSET=$(DIFF_OFFSET) ./$(BUILD)/test diff/random_programs

# The tests under ThreadSanitizer (the local world's ranks are threads).
$(BUILD)/test-tsan: $(TEST_SRC) $(HEADERS) | $(BUILD)
	$(CC) -std=c11 $(WARN) -O1 -g -fsanitize=thread -o $@ tests/main.c $(LDLIBS)

test-tsan: $(BUILD)/test-tsan
	TSAN_OPTIONS=halt_on_error=1 ./$(BUILD)/test-tsan

# The tests under valgrind's memcheck (slow: minutes).
valgrind: $(BUILD)/test
	valgrind --error-exitcode=1 --errors-for-leak-kinds=definite --leak-check=full --quiet ./$(BUILD)/test

# The fuzzer (clang's libFuzzer with ASan and UBSan) for FUZZ_SECONDS on a copy of
# tests/fuzz_corpus; a finding stops it and leaves the input in build/ (replay
# it: build/fuzz-replay FILE).
FUZZ_SECONDS ?= 60
FUZZ_CC ?= clang
$(BUILD)/fuzz: tests/fuzz.c $(HEADERS) | $(BUILD)
	$(FUZZ_CC) -std=c11 $(WARN) -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -o $@ tests/fuzz.c $(LDLIBS)
$(BUILD)/fuzz-replay: tests/fuzz.c $(HEADERS) | $(BUILD)
	$(FUZZ_CC) -std=c11 $(WARN) -O1 -g -DHIR_FUZZ_MAIN -fsanitize=address,undefined -o $@ tests/fuzz.c $(LDLIBS)

fuzz: $(BUILD)/fuzz $(BUILD)/fuzz-replay
	rm -rf $(BUILD)/fuzz_work && mkdir -p $(BUILD)/fuzz_work && cp tests/fuzz_corpus/* $(BUILD)/fuzz_work/
	cd $(BUILD) && ./fuzz -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 fuzz_work > fuzz.log 2>&1; s=$$?; \
	  grep -E "^#[0-9]+.*(DONE|pulse)|finding|ERROR|SUMMARY|number_of_executed_units|Test unit" fuzz.log | tail -8; exit $$s

examples: $(patsubst examples/%.c,$(BUILD)/%,$(wildcard examples/*.c))

test-gpu: $(BUILD)/test-gpu $(BUILD)/nvtx_probe.so examples
	tests/gpu/run.sh

BENCHES := $(patsubst bench/%.c,$(BUILD)/bench-%,$(wildcard bench/*.c))

$(BUILD)/bench-%: bench/%.c bench/bench.h $(HEADERS) | $(BUILD)
	$(CC) -std=c11 $(WARN) $(CFLAGS) $(CUDA_CFLAGS) -o $@ $< $(CUDA_LDLIBS) $(LDLIBS)

bench-build: $(BENCHES)

bench: $(BENCHES)
	@for b in $(BENCHES); do echo "== $$b"; ./$$b || exit 1; echo; done

# Headers, and pkg-config files: hostir (the CPU backend) and, where CUDA was
# found, hostir-cuda (HOSTIR_CUDA, cuBLAS, NCCL).
PC_DIR = $(DESTDIR)$(PREFIX)/lib/pkgconfig
VERSION := $(shell sed -n 's/^\#define HOSTIR_VERSION "\([^"]*\)".*/\1/p' hostir.h)
install:
	install -d $(DESTDIR)$(PREFIX)/include $(PC_DIR)
	install -m 644 $(HEADERS) $(DESTDIR)$(PREFIX)/include/
	sed -e 's|@PREFIX@|$(PREFIX)|; s|@VERSION@|$(VERSION)|; s|@SUFFIX@||; s|@CFLAGS@||; s|@LIBS@||' hostir.pc.in > $(PC_DIR)/hostir.pc
	$(if $(CUDA_HOME),sed -e 's|@PREFIX@|$(PREFIX)|; s|@VERSION@|$(VERSION)|; s|@SUFFIX@|-cuda|; s|@CFLAGS@| $(CUDA_CFLAGS)|; s|@LIBS@|$(CUDA_LDLIBS) |' \
	  hostir.pc.in > $(PC_DIR)/hostir-cuda.pc)

clean:
	rm -rf $(BUILD)
