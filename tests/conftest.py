"""Test setup: 8 fake CPU devices (before JAX is imported), float32 matmuls, fixed seeds.

The suite runs on the 8 CPU devices everywhere. On a host with an NVIDIA GPU and jax's CUDA
plugin, JAX_PLATFORMS becomes ``cpu,cuda``: CPU stays the default (the suite is unchanged)
and the GPU is there for the ``@pytest.mark.gpu`` tests (``pytest -m gpu``), which put their
arrays on it with the :func:`on_gpu` fixture. An explicit JAX_PLATFORMS is respected.
"""

import contextlib
import gc
import glob
import importlib.util
import os

_CUDA_PLUGINS = ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_plugins.xla_cuda13",
                 "jax_plugins.xla_cuda12")


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def gpu_present() -> bool:
    """An NVIDIA device node and jax's CUDA plugin, found without importing jax."""
    return bool(glob.glob("/dev/nvidia[0-9]*")) and any(map(_module_exists, _CUDA_PLUGINS))


def jax_platforms(preset: str | None, gpu: bool) -> str:
    """JAX_PLATFORMS for the tests: the preset one, else CPU first (+ cuda with a GPU)."""
    if preset:
        return preset
    return "cpu,cuda" if gpu else "cpu"


os.environ["JAX_PLATFORMS"] = jax_platforms(os.environ.get("JAX_PLATFORMS"), gpu_present())
# torch (the parity references), MKL and OpenBLAS on one thread each (read when torch / numpy's
# BLAS first load, so before any test imports them): their OpenMP pools on the suite's tiny
# tensors spend far more time synchronising than computing, worst with the other xdist worker
# on the second core — one Wan 2.2 VAE encode in diffusers took 0.1-2 s on two threads and
# 0.02 s on one; the VAE parity modules 53 -> 31 CPU s alone, five parity modules on two
# workers 139 -> 89 CPU s. XLA's own thread pool is not OpenMP's and is unchanged. The
# references' values agree to rounding (a reduction's order).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# no persistent compilation cache unless a test asks for one (hermetic runs, ~/.cache untouched)
os.environ.setdefault("DITAX_CACHE_DIR", "none")
# XLA with most optimisations off (jax's ``jax_disable_most_optimizations``: LLVM's backend
# optimisation level 0; the HLO passes, so fusion and every value, are unchanged): about 60% of
# the suite is XLA compiling tiny programs, and this cuts it by a third. Set in the environment
# so that the suite's own subprocesses (CLI runs, multi-host, the GPU script's dry run) inherit
# it. The modules in FULL_OPTIMIZATION_MODULES (what a TPU's compiler writes: copies, memory)
# compile with every optimisation on (``ditax plan``'s CPU compiles in test_plan.py need not: the
# HLO passes, so what its audit counts, are the same; 27 -> 13 CPU s).
# JAX_DISABLE_MOST_OPTIMIZATIONS=0 runs everything so.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# and XLA:CPU's elemental emitters for fusions (tests/refs/xla_test_flags.py says why)
from xla_test_flags import FAST_CPU_CODEGEN, fast  # noqa: E402

os.environ.setdefault("XLA_FLAGS", "")
if "--xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
if fast() and "--xla_cpu_use_fusion_emitters" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " " + FAST_CPU_CODEGEN
FULL_OPTIMIZATION_MODULES = {"test_tpu_compile.py"}

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
# Python's cyclic collector less often (a young generation of 100,000 objects, not 2,000):
# tracing and lowering allocate millions of short-lived objects, and the default thresholds
# walk jax's whole object graph again and again: the transformer, image-to-video and train
# modules take ~8% less CPU (77.3 vs 84.5 s), peak memory unchanged (1.65 GB). Collection
# still runs.
gc.set_threshold(100_000, 50, 50)


@pytest.fixture
def rng():
    """A fresh numpy Generator per test (seeded from the test's node id for reproducibility)."""
    import zlib

    seed = zlib.crc32(os.environ.get("PYTEST_CURRENT_TEST", "x").encode())
    return np.random.default_rng(seed)


def cuda_devices() -> list:
    """jax's CUDA devices (empty without one)."""
    try:
        return [d for d in jax.devices("gpu") if d.platform == "gpu"]
    except RuntimeError:
        return []


def has_cuda() -> bool:
    return bool(cuda_devices())


@pytest.fixture
def on_gpu():
    """For GPU tests: uncommitted arrays and jit on the first CUDA device, and ditax's
    target platform set to it (CPU is the default platform of the test process)."""
    import ditax

    devices = cuda_devices()
    if not devices:
        pytest.skip("needs a CUDA GPU")
    dev = devices[0]
    with jax.default_device(dev), ditax.target_platform(
            "cuda", compute_capability=getattr(dev, "compute_capability", None)):
        yield dev


# `make test` runs two xdist workers with ``--dist loadscope --no-loadscope-reorder`` (this
# order, not xdist's by test count): each module (or test class) runs whole on one
# worker, so a module fixture (a trained recipe, a pipeline folder, a killed-and-resumed run) is
# built once, not once per worker. The slowest modules (measured with --durations) go first, so
# that the two workers finish together instead of one waiting on the last long module.
SLOWEST_FIRST = (
    "train/test_distill.py",
    "recipes/test_demo_model.py", "recipes/test_flux_demo_model.py", "train/test_resume.py",
    "serve/test_serve_multihost.py", "pipelines/test_continuous.py",
    "train/test_export_run.py", "train/test_ltx2_train.py", "serve/test_serve_signals.py",
    "train/test_multihost.py", "train/test_distill_ltx2.py", "nn/test_offload.py",
    "train/test_bucket_train.py", "train/test_object_storage.py",
    "train/test_preprocess_processes.py",
    "benchmarks/test_gpu_check.py", "serve/test_serve_faults.py", "serve/test_serve_api.py",
    "serve/test_serve_postgres.py", "serve/test_serve_warm.py",
    "serve/test_serve_browser.py", "serve/test_serve_image.py",
    "serve/test_serve_batch_families.py", "serve/test_serve_worker_faults.py",
    "models/ltx2/test_ltx2_quant_single.py", "pipelines/ltx2/test_ltx2_pipeline.py",
    "pipelines/ltx2/test_ltx2_step_cache.py", "models/vae/test_parallel_vae.py",
    "pipelines/ltx2/test_ltx2_two_stage.py", "pipelines/flux2/test_flux2_pipeline.py",
    "plan/test_plan_fit.py",
    "pipelines/test_cache_batch.py", "lora/test_row_strengths.py", "serve/test_serve_events.py",
    "test_conformance.py", "train/test_train.py",
    "train/test_train_image.py", "train/test_vace_train.py",
    "train/test_train_e2e.py", "lora/test_lora_train.py", "models/wan/test_transformer.py",
    "train/test_flux_train.py", "models/flux2/test_flux2_train.py",
    "lora/test_flux_lora_train.py", "test_compile_cache.py",
    "cli/test_cli.py", "attention/test_sage.py", "models/test_quantized_load.py",
    "pipelines/wan/test_image_to_video.py", "models/wan/test_vace_transformer.py",
    "pipelines/wan/test_vace_pipeline.py", "pipelines/wan/test_video_to_video.py",
    "pipelines/wan/test_animate_pipeline.py", "cli/test_generate_outputs.py",
    "pipelines/test_batch_families.py", "serve/test_serve_third_family.py",
    "cli/test_generate_prompts.py", "train/test_checkpoint_space.py",
    "train/test_lora_checkpoint.py", "plan/test_plan_distill.py",
    "recipes/test_demo_student.py", "recipes/test_flux_demo_student.py")


# The end-to-end tier (marked ``slow``; ``make test-slow``, and CI after ``make test``): whole
# programs run end to end — the recipes that train and distil the demo models, runs of several
# processes (multi-host training and serving, signals, killed workers and servers, replicas),
# and the long training / distillation runs of every family. ``make test`` (``-m "not slow"``) keeps the
# rest: every module and kernel against its reference, every CLI and server check.
END_TO_END = (
    "benchmarks/test_tpu_train_bench.py",
    # four processes loading the tiny folder (about 16 s); its refusals stay in the fast tier
    "benchmarks/test_tpu_loader_bench.py::test_tiny_case_runs_every_variant_through_the_loader",
    "recipes/test_demo_model.py", "recipes/test_flux_demo_model.py",
    "recipes/test_demo_student.py", "recipes/test_flux_demo_student.py",
    "recipes/test_init_random.py", "recipes/test_demo_causal.py",
    "test_exec_cache.py::test_demo_second_process_reads_the_programs",
    "train/test_distill.py", "train/test_distill_ltx2.py", "train/test_self_forcing.py",
    "train/test_ltx2_train.py", "train/test_distill_sparse_export.py",
    "train/test_bucket_train.py", "train/test_export_run.py", "train/test_object_storage.py",
    "train/test_multihost.py", "train/test_preprocess_processes.py",
    "serve/test_serve_multihost.py", "serve/test_serve_signals.py",
    "serve/test_serve_worker_faults.py", "benchmarks/test_gpu_check.py",
    # processes killed and rerun, a real PostgreSQL server's replicas, mp4s through preprocess
    # into training, a second process reading the compile cache, a warm server's start
    "train/test_resume.py", "train/test_checkpoint_space.py", "train/test_train_e2e.py",
    "serve/test_serve_faults.py", "serve/test_serve_postgres.py", "serve/test_serve_warm.py",
    "test_compile_cache.py",
    # VSA training: a 4-step run, a 2 + 2 resumed one and a LoRA run (about 15 s); VSA on a
    # fsdp2 x tensor2 mesh against one device (about 10 s)
    "train/test_vsa_train.py", "models/wan/test_sparse_vsa_mesh.py",
    # DMD2 with a sparse student (about 38 s), the VSA table kernels inside the Wan model
    # (17 s; the kernels alone against the jnp path stay in the fast tier), the sparse
    # quality benchmark's smoke run (6 s)
    "train/test_distill_sparse.py", "models/wan/test_sparse_vsa_table_model.py",
    "benchmarks/test_sparse_quality.py",
    # the plan of the chip's cheapest row compiled again deviceless for a v5e (Wan 1.3B at
    # 480x832x17, full size: about 75 s); the stored numbers' check is in the fast tier
    "plan/test_plan_vs_chip_e2e.py",
    # FLUX.2's double block compiled deviceless for a v5e at full width, its copies counted
    # (about 55 s on 2 cores); the head-major block's values stay in the fast tier
    "models/flux2/test_flux2_tpu_layout.py",
    # single checks of 5-10 s each whose code has faster checks in the fast tier (the fast tier
    # measured 12:11 with them on this 2-core host)
    "pipelines/test_continuous.py::test_rows_on_a_mesh",
    "pipelines/ltx2/test_ltx2_step_cache.py::"
    "test_skipped_step_reapplies_each_branchs_residual_of_both_streams",
    "nn/test_offload.py::test_lora_step_with_offload_equals_resident",
    "cli/test_generate_causal.py::test_generate_streams_a_causal_folder",
    "models/wan/test_causal.py::test_gradients_kernel_path_and_cache_path",
    "attention/test_sparse_vsa_table.py::test_calls_split_by_the_smem_budget_equal_one_call",
    "models/wan/test_sparse_attention.py::test_vace_control_tokens_follow_the_layout",
    "models/wan/test_sparse_attention.py::test_bench_runs_sparse_and_names_it",
    # a causal job's chunks played by the page in Chromium while the server makes the rest
    "serve/test_serve_browser_stream.py",
    # the fast tier's longest single checks (each > 7 s on 2 cores), beside faster ones of the
    # same code in the fast tier: a whole browser / server / CLI run
    "serve/test_serve_browser.py", "serve/test_serve_batch_families.py",
    "serve/test_serve_ltx2.py", "benchmarks/test_vae_decode.py",
    "models/vae/test_wan_vae_chunk_memory.py::test_budgeted_chunks_decode_the_same_frames",
    "pipelines/ltx2/test_ltx2_step_cache.py::"
    "test_threshold_zero_is_uncached_larger_skips_every_branch",
    "models/vae/test_parallel_vae.py::"
    "test_wan_decode_encode_match_one_device[wan21-mesh_shape0-5-2]",
    "lora/test_lora_train.py::"
    "test_only_adapters_train_resume_is_exact_and_the_files_load_in_diffusers_and_ditax",
    "train/test_train_image.py::test_i2v_config_trains_and_a_mesh_step_equals_one_device",
    "models/ltx2/test_ltx2_quant_single.py::test_bench",
    "cli/test_compile_cache_cli.py::test_bench_follows_the_cache_rules",
    "pipelines/ltx2/test_ltx2_pipeline.py::test_generate_writes_the_mp4_with_its_sound_track",
    "pipelines/ltx2/test_ltx2_two_stage.py::test_generate_with_upsampler",
    "models/test_init_groups.py::test_grouped_init_draws_the_one_program_values_in_place[extra1]",
    # whole modules whose cost is one shared compile or model (moving one test of such a module
    # only moves its fixture's cost to the next test): plans of big training steps, whole-model
    # runs on meshes, the per-family training steps beside train/test_train.py
    "plan/test_plan_distill.py", "plan/test_plan_fit.py", "nn/test_quant_random.py",
    "pipelines/wan/test_dense_steps.py", "models/wan/test_causal_mesh.py",
    "models/vae/test_parallel_vae.py", "pipelines/wan/test_step_cache_image.py",
    "train/test_vace_train.py", "train/test_flux_train.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    end_to_end = set(END_TO_END)
    for item in items:
        node = item.nodeid.removeprefix("tests/")
        # a whole file, one test (every parameter) or one parameter of it
        if {node.split("::")[0], node.split("[")[0], node} & end_to_end:
            item.add_marker(pytest.mark.slow)

    def module_rank(item):
        return rank.get(item.nodeid.split("::")[0].removeprefix("tests/"), len(rank))

    items.sort(key=module_rank)   # stable: the order inside a module and among the rest stays


@contextlib.contextmanager
def most_optimizations_off(off: bool):
    """jax's ``jax_disable_most_optimizations`` set to ``off`` inside, restored after."""
    prev = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", off)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", prev)


@pytest.fixture(scope="module", autouse=True)
def _optimizations(request):
    """Every optimisation on for the modules in FULL_OPTIMIZATION_MODULES."""
    full = os.path.basename(str(request.path)) in FULL_OPTIMIZATION_MODULES
    with most_optimizations_off(False) if full else contextlib.nullcontext():
        yield


@pytest.fixture(scope="module")
def fast_compile():
    """XLA with most optimisations off for one test module (jax's
    ``jax_disable_most_optimizations``): the training tests compile ~3x faster on CPU. The flag
    is restored afterwards and the compile caches cleared, so nothing compiled this way is
    reused by another module."""
    with most_optimizations_off(True):
        yield
    jax.clear_caches()
