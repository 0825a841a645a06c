# Thin wrapper over CMake. The README's two commands: `make run` and `make test`.
BUILD      ?= build
ASAN_BUILD ?= build-asan
POLICY     ?= cephalon.policy.edn.example
LISTEN     ?= 127.0.0.1:7070
DATA       ?= var
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all deps build build-asan run test test-unit test-asan test-valgrind clean

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

# Both builds must pass: the normal one, then ASan+UBSan.
test: test-unit test-asan

test-unit: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: build-asan
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS)

# The tests that start the real daemon, with the daemon under valgrind: any memory error or
# definite leak makes it exit 99, which the tests see as a failed stop.
VALGRIND_TESTS ?= test_daemon|test_api_flow|test_api_errors|test_context_api|test_channels_api|test_cli
test-valgrind:
	@./scripts/install-deps.sh valgrind
	cmake -S . -B build-vg -DCMAKE_BUILD_TYPE=Debug
	cmake --build build-vg -j $(JOBS)
	cd build-vg && CPH_DAEMON_WRAPPER="valgrind --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite --show-leak-kinds=definite --quiet" \
	  ctest --output-on-failure --timeout 1800 -R '$(VALGRIND_TESTS)'

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
