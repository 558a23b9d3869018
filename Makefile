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

HEADERS := hostir.h
TEST_SRC := $(wildcard tests/*.c tests/*.h) $(wildcard tests/golden/*.txt)

.PHONY: all run test test-asan test-gpu bench bench-build examples install clean

all: $(BUILD)/test $(BUILD)/main

$(BUILD):
	mkdir -p $(BUILD)

$(BUILD)/test: $(TEST_SRC) $(HEADERS) | $(BUILD)
	$(CC) -std=c11 $(WARN) $(CFLAGS) -o $@ tests/main.c $(LDLIBS)

$(BUILD)/test-asan: $(TEST_SRC) $(HEADERS) | $(BUILD)
	$(CC) -std=c11 $(WARN) -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all \
	  -fno-omit-frame-pointer -o $@ tests/main.c $(LDLIBS)

$(BUILD)/%: examples/%.c $(HEADERS) | $(BUILD)
	$(CC) -std=c11 $(WARN) $(CFLAGS) -o $@ $< $(LDLIBS)

run: $(BUILD)/main
	./$(BUILD)/main

test: $(BUILD)/test
	./$(BUILD)/test

test-asan: $(BUILD)/test-asan
	ASAN_OPTIONS=detect_leaks=1 ./$(BUILD)/test-asan

examples: $(patsubst examples/%.c,$(BUILD)/%,$(wildcard examples/*.c))

test-gpu:
	@echo "test-gpu: needs the CUDA backend (issue 6); nothing to run yet"; exit 1

BENCHES := $(patsubst bench/%.c,$(BUILD)/bench-%,$(wildcard bench/*.c))

$(BUILD)/bench-%: bench/%.c $(HEADERS) | $(BUILD)
	$(CC) -std=c11 $(WARN) $(CFLAGS) -o $@ $< $(LDLIBS)

bench-build: $(BENCHES)

bench: $(BENCHES)
	@for b in $(BENCHES); do echo "== $$b"; ./$$b || exit 1; echo; done

install:
	install -d $(DESTDIR)$(PREFIX)/include
	install -m 644 $(HEADERS) $(DESTDIR)$(PREFIX)/include/

clean:
	rm -rf $(BUILD)
