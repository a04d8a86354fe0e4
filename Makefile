# ditax — two commands for a newcomer: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Three stamps, each one install step: ditax + its runtime dependencies (what `make demo` needs),
# then the [test] extra (torch, diffusers, transformers: the parity references, ~2 GB), then
# libtpu. `make demo` installs the first only; `make test` all three, in order, on a fresh
# machine or on top of a demo install.
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
TPU_STAMP := $(VENV)/.installed-tpu
# pip install, done by uv with pip's configured package sources (pip where uv fails): tools/install.py
INSTALL = $(BIN)/python tools/install.py
export XLA_FLAGS ?= --xla_force_host_platform_device_count=8
export TOKENIZERS_PARALLELISM = false
export HF_HUB_OFFLINE ?= 1

.PHONY: demo demo-model demo-student flux-demo-model test test-slow test-tpu bench install install-test clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(INSTALL) -c constraints.txt -e .
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(INSTALL) -c constraints.txt -e ".[test]"
	touch $(TEST_STAMP)

# libtpu (the [tpu] extra, pinned to the jax version): the TPU test group compiles ditax for a
# TPU v6e topology without a TPU (deviceless). Linux only; elsewhere those tests skip.
$(TPU_STAMP): $(TEST_STAMP)
	$(INSTALL) -c constraints.txt -e ".[tpu]"
	touch $(TPU_STAMP)

install: $(STAMP)
install-test: $(TEST_STAMP) $(TPU_STAMP)

# The main job: three prompts -> videos + contact sheet with the demo model ditax trained
# itself (shipped in src/ditax/assets/demo_model) and its 4-step student (the LoRA in
# src/ditax/assets/demo_student), its causal student (src/ditax/assets/demo_causal) at 1x and
# 4x the teacher's frames, then three prompts -> images + sheet with
# the small Flux (src/ditax/assets/flux_demo_model), each scored for prompt following.
demo: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=1 $(BIN)/python -m ditax.demo

# Train the demo model from nothing (data, VAE, text encoder, latents, transformer, folder)
# into demo_model/; `cp -r demo_model/pipeline/. src/ditax/assets/demo_model/` ships it.
demo-model: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=1 $(BIN)/python -m ditax.recipes.demo_model --out demo_model

# Distil the demo model into its 4-step student (data, DMD2 LoRA, score vs the teacher, ship)
# into demo_student/; `cp -r demo_student/student/. src/ditax/assets/demo_student/` ships it.
demo-student: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=1 $(BIN)/python -m ditax.recipes.demo_student --out demo_student

# Train the small Flux from nothing (images, Flux VAE, text towers, latents, transformer,
# folder, score) into flux_demo_model/;
# `cp -r flux_demo_model/pipeline/. src/ditax/assets/flux_demo_model/` ships it.
flux-demo-model: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=1 $(BIN)/python -m ditax.recipes.flux_demo_model --out flux_demo_model

# Distil the demo model into its causal student (Self-Forcing: chunk by chunk with a KV cache,
# 4 steps a chunk; data, distill, long rollouts, export, score per window at 1x and 4x the
# teacher's frames)
# into demo_causal/; then `python -m ditax.recipes.demo_causal --out demo_causal --folder
# src/ditax/assets/demo_causal` ships it (the run kept; its VAE, text encoder and tokenizer:
# relative links to ../demo_model).
.PHONY: demo-causal
demo-causal: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=1 $(BIN)/python -m ditax.recipes.demo_causal --out demo_causal

# Distil the small Flux's 4-step student (DMD2, a LoRA on src/ditax/assets/flux_demo_model)
# into flux_demo_student/; `cp flux_demo_student/student/* src/ditax/assets/flux_demo_student/`
# ships it.
.PHONY: flux-demo-student
flux-demo-student: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=1 $(BIN)/python -m ditax.recipes.flux_demo_student --out flux_demo_student

# The whole test suite on CPU (8 fake devices), TPU compiles included (deviceless), on two
# pytest-xdist workers. Under tcmalloc where it is installed (Debian: libtcmalloc-minimal4;
# .ci/run installs it): XLA's compiles of the suite's many small programs allocate heavily,
# and the transformer, image-to-video and train modules take ~4% less CPU than under glibc's
# malloc (77.6 vs 80.8 s). The suite passes either way.
TCMALLOC := $(firstword $(wildcard /usr/lib/*/libtcmalloc_minimal.so.4 \
  /usr/lib64/libtcmalloc_minimal.so.4))
# PYTHONDONTWRITEBYTECODE (set by some sandboxes) is dropped for the suite: uv installs
# without byte-compiling, so under it every Python process the tests start (a CLI run, a
# server, a second host) compiles jax and its dependencies from source again: 3.8 s to import
# them instead of 1.3 s; without it the first import writes the .pyc files.
# --max-worker-restart=0: a worker that dies (an XLA abort) fails its test and the run ends;
# pytest-xdist 3.8's loadscope scheduler can wait forever after replacing a crashed worker
# (pytest-dev/pytest-xdist#1378), which once held CI until its 90-minute limit.
# `make test` is the everyday suite (`-m "not slow"`); `make test-slow` the end-to-end tier
# (tests/conftest.py's END_TO_END: the demo recipes, multi-process runs, long training and
# distillation runs); CI (.ci/run) runs both.
PYTEST := $(if $(TCMALLOC),LD_PRELOAD="$(TCMALLOC)") env -u PYTHONDONTWRITEBYTECODE \
  $(BIN)/python -m pytest tests -q -ra -n 2 --max-worker-restart=0 --dist loadscope \
  --no-loadscope-reorder --durations=25
test: $(TEST_STAMP) $(TPU_STAMP)
	$(PYTEST) -m "not slow"

test-slow: $(TEST_STAMP) $(TPU_STAMP)
	$(PYTEST) -m slow

# The TPU group (tests/tpu: kernels, a training step, the demo video on the chip against the
# CPU) on a TPU machine, in one process (one program holds a chip; no xdist). Without a TPU its
# tests skip; DITAX_TPU_TESTS=cpu runs them with the CPU standing in (to check the tests).
test-tpu: $(TEST_STAMP)
	JAX_PLATFORMS=tpu,cpu JAX_DISABLE_MOST_OPTIMIZATIONS=0 $(BIN)/python -m pytest tests/tpu -q -ra \
	  -p no:xdist -p no:cacheprovider

bench: $(TEST_STAMP)
	$(BIN)/python benchmarks/transformer_cpu.py

clean:
	rm -rf $(VENV) demo_out demo_model demo_student demo_causal flux_demo_model flux_demo_student out .pytest_cache
