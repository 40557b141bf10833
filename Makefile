# capsule: the two commands a newcomer needs are `make demo` and `make test`.
# Each target first does whatever set-up is missing: Debian packages
# (scripts/bootstrap.sh), the Meson build, the guest kernel in the cache.

BUILD       ?= build
ASAN_BUILD  ?= build-asan
# clang: ASan, UBSan and libFuzzer's instrumentation (scripts/fuzz.sh).
CLANG_BUILD ?= build-clang

.PHONY: all bootstrap build kernel demo test fuzz bench deb clean

all: build

bootstrap:
	@scripts/bootstrap.sh

build: bootstrap
	@[ -f $(BUILD)/build.ninja ] || meson setup $(BUILD) >/dev/null
	@ninja -C $(BUILD) >/dev/null

# The guest kernel: built once (minutes), then cached by source version and
# config hash. The script prints the path of the cached vmlinux.
kernel: bootstrap
	@guest/build-kernel.sh >/dev/null

demo: build kernel
	@scripts/demo.sh $(BUILD)

test: build kernel
	@tests/run.sh $(BUILD) $(ASAN_BUILD) $(CLANG_BUILD)

# Coverage-guided fuzzing (docs/architecture.md, "Tests"): each target of
# tests/fuzz for FUZZ_TIME seconds (default 60; FUZZ_TARGETS picks some;
# FUZZ_JOBS=N runs N at once, each still for FUZZ_TIME s of the clock),
# from its seeds; prints inputs run, coverage and crashes per target.
# What it finds is in fuzz-out/<target>/ (crashes/, corpus/); FUZZ_MERGE=1
# adds the inputs that add coverage to tests/fuzz/corpus/<target>.
fuzz: bootstrap
	@scripts/fuzz.sh $(CLANG_BUILD)

bench: build kernel
	@bench/run.sh $(BUILD)

# The Debian package (docs/packaging.md): $(BUILD)/dist/capsule_VERSION_amd64.deb.
# The guest kernel is not in it (each user builds it once), so no kernel here.
deb: build
	@scripts/make-deb.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(CLANG_BUILD) fuzz-out
