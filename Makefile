# Thin wrapper over CMake. The README's two commands: `make run` and `make test`.
BUILD      ?= build
ASAN_BUILD ?= build-asan
POLICY     ?= cephalon.policy.edn.example
LISTEN     ?= 127.0.0.1:7070
DATA       ?= var
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
FUZZ_BUILD ?= build-fuzz
FUZZ_TIME  ?= 60
FUZZ_SMOKE ?= 10

.PHONY: all deps build build-asan run test test-unit test-asan test-valgrind clean \
        build-fuzz fuzz fuzz-smoke cluster

all: build

deps:
	@./scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DCPH_SANITIZE=ON
	cmake --build $(ASAN_BUILD) -j $(JOBS)

run: build
	@mkdir -p $(DATA)
	@echo "try: curl -s $(LISTEN)/v1/sessions -d '{\"id\":\"s1\",\"class\":\"interactive\",\"subscribe\":[\"general\"]}'"
	@echo "     curl -s $(LISTEN)/v1/events -d '{\"events\":[{\"channel\":\"general\",\"sender\":\"ann\",\"body\":\"hello\"}]}'"
	@echo "     curl -s $(LISTEN)/v1/turns/lease -d '{\"worker\":\"w1\",\"wait_ms\":5000}'   then with its id and lease:  curl -s $(LISTEN)/v1/turns/ID/complete -d '{\"lease\":\"LEASE\",\"cost\":{\"tokens\":1,\"tool_calls\":0},\"reply\":{\"body\":\"hi ann\"}}'"
	@echo "     curl -s '$(LISTEN)/v1/replies?after=0&wait_ms=5000'"
	$(BUILD)/bin/cephalond --policy $(POLICY) --data $(DATA) --listen $(LISTEN)

# Both builds must pass: the normal one, then ASan+UBSan; then every fuzzer for a short while.
test: test-unit test-asan
	@$(MAKE) --no-print-directory fuzz-smoke

test-unit: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: build-asan
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS)

# The tests that start the real daemon, with the daemon under valgrind: any memory error or
# definite leak makes it exit 99, which the tests see as a failed stop.
VALGRIND_TESTS ?= test_daemon|test_api_flow|test_api_errors|test_context_api|test_channels_api|test_cli|test_context_explorer|test_ui
test-valgrind:
	@./scripts/install-deps.sh valgrind
	cmake -S . -B build-vg -DCMAKE_BUILD_TYPE=Debug
	cmake --build build-vg -j $(JOBS)
	cd build-vg && CPH_DAEMON_WRAPPER="valgrind --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite --show-leak-kinds=definite --quiet" \
	  ctest --output-on-failure --timeout 1800 -R '$(VALGRIND_TESTS)'

# libFuzzer targets (tests/fuzz/README.md): clang, its own build dir, never the gcc builds.
build-fuzz: deps
	CC=clang cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCPH_FUZZ=ON
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzzers

# Each fuzzer FUZZ_TIME seconds, JOBS at once; their corpora grow in $(FUZZ_BUILD)/fuzz-work.
fuzz: build-fuzz
	tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_TIME) $(JOBS) keep

# Each fuzzer FUZZ_SMOKE seconds from its seed corpus; any finding fails `make test`.
fuzz-smoke: build-fuzz
	tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SMOKE) $(JOBS) smoke

# Benchmarks (DESIGN §12): a RelWithDebInfo build of its own (BENCH_BUILD, so the figures
# never come from a Debug or sanitizer build), the anchors (scripts/bench-deps.sh), every
# scenario side by side, then bench/results/latest.md and its plots. A few minutes.
BENCH_BUILD ?= build-bench
.PHONY: bench
bench: deps
	@./scripts/bench-deps.sh
	cmake -S . -B $(BENCH_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(BENCH_BUILD) -j $(JOBS) --target cephalon-bench cephalond cephalon-worker
	./bench/run.sh $(BENCH_BUILD)/bin

# Soak (not part of `make test`): 10,000 sessions under sustained ingest and turn traffic for
# 5 minutes against the RelWithDebInfo cephalond; prints memory, descriptors and lease latency
# and fails if they grow or drift. SOAK_ARGS passes options, e.g. SOAK_ARGS="--duration 600".
SOAK_ARGS ?=
SOAK_SRC   = tests/soak/soak.c tests/support/daemon.c tests/support/testutil.c \
             tests/support/hclient.c tests/support/oas.c
.PHONY: soak
soak: build
	$(CC) -std=c11 -O2 -g -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
	  -Wno-unused-parameter -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -I. $(SOAK_SRC) \
	  $$(pkg-config --cflags --libs jansson msgpack) -lpthread -o $(BUILD)/bin/cephalon-soak
	CPH_BIN_DIR=$(abspath $(BUILD))/bin $(BUILD)/bin/cephalon-soak $(SOAK_ARGS)

# etcd, three NATS JetStream servers and three daemons with :cluster on loopback (README
# "Running a cluster"); Ctrl-C stops.
cluster: build
	scripts/cluster.sh $(BUILD)/bin $(or $(CLUSTER_PORT),7700)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
