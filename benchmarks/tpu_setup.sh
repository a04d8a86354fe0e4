# Source on the lent TPU machine (no internet, ditax not installed) from the repository root:
#   source benchmarks/tpu_setup.sh
# Installs ditax's runtime dependencies into /tmp/site from the machine's own package index
# (file:///opt/pypi/simple), then what that index lacks from .whl-tpu/ (carried with the
# checkout: grain, array_record, and imageio-ffmpeg as its Python files plus an xz-compressed
# ffmpeg, since its wheel alone is over the 64 MiB the checkout may carry), and puts src/ first
# and /tmp/site last on PYTHONPATH, so the machine's own JAX stays the one imported.
# Skipped when /tmp/site/.ditax-ready exists (a warm machine keeps /tmp between calls).
# Preparing .whl-tpu here (once): see docs/tpu_v5e.md, "Running it".
SITE=/tmp/site
if [ ! -f "$SITE/.ditax-ready" ]; then
  t0=$(date +%s)
  PIP="env PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --only-binary=:all: \
--disable-pip-version-check --index-url file:///opt/pypi/simple --target $SITE"
  $PIP flax optax safetensors pyyaml pydantic tqdm tokenizers jinja2 huggingface_hub pillow \
    imageio fsspec 2>&1 | grep -v "WARNING: Target directory" | tail -3
  # what training, serving and the demo sheets need besides (one at a time: one the index
  # lacks must not stop the others); DITAX_SETUP=minimal skips them
  if [ "${DITAX_SETUP:-full}" != minimal ]; then
    for p in orbax-checkpoint tensorboardX matplotlib fastapi uvicorn absl-py etils cloudpickle \
        protobuf portpicker; do
      $PIP "$p" 2>&1 | grep -v "WARNING: Target directory" | tail -1 || true
    done
  fi
  touch "$SITE/.ditax-ready"
  echo "tpu_setup: installed into $SITE in $(( $(date +%s) - t0 )) s"
fi
# the carried wheels (a call may come without them: then a later call installs them)
if [ ! -f "$SITE/.wheels-ready" ] && [ -d .whl-tpu ]; then
  if ls .whl-tpu/*.whl >/dev/null 2>&1; then
    env PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps \
      --no-compile --target "$SITE" .whl-tpu/*.whl 2>&1 | grep -v "WARNING: Target" | tail -1
  fi
  if [ -d .whl-tpu/imageio_ffmpeg_pkg ]; then
    rm -rf "$SITE/imageio_ffmpeg"
    cp -r .whl-tpu/imageio_ffmpeg_pkg/imageio_ffmpeg "$SITE/"
    for x in .whl-tpu/imageio_ffmpeg_pkg/*.xz; do
      out="$SITE/imageio_ffmpeg/binaries/$(basename "${x%.xz}")"
      python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$x" "$out"
      chmod +x "$out"
    done
  fi
  touch "$SITE/.wheels-ready"
fi
# the same things carried in two parts (benchmarks/tpu_carry.sh: .chip/a in one call, .chip/b
# in a later warm one), for a checkout too large to carry .whl-tpu beside it
for d in .chip/a .chip/b; do
  [ -d "$d" ] || continue
  if [ ! -f "$SITE/.wheels-ready" ] && ls "$d"/*.whl >/dev/null 2>&1; then
    env PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps \
      --no-compile --target "$SITE" "$d"/*.whl 2>&1 | grep -v "WARNING: Target" | tail -1
    touch "$SITE/.wheels-ready"
  fi
  mkdir -p /tmp/ffparts && cp "$d"/ff.part* /tmp/ffparts/ 2>/dev/null || true
  [ -d "$d/imageio_ffmpeg" ] && rm -rf /tmp/ffparts/imageio_ffmpeg && cp -r "$d/imageio_ffmpeg" /tmp/ffparts/
done
if [ ! -f "$SITE/.ffmpeg-ready" ] && [ -f /tmp/ffparts/ff.parts ] && [ -d /tmp/ffparts/imageio_ffmpeg ]; then
  read -r n name < /tmp/ffparts/ff.parts
  if [ "$(ls /tmp/ffparts/ff.part[0-9]* | wc -l)" -eq "$n" ]; then
    rm -rf "$SITE/imageio_ffmpeg" && cp -r /tmp/ffparts/imageio_ffmpeg "$SITE/"
    cat /tmp/ffparts/ff.part[0-9]* | python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), open(sys.argv[1],'wb'))" "$SITE/imageio_ffmpeg/binaries/$name"
    chmod +x "$SITE/imageio_ffmpeg/binaries/$name" && touch "$SITE/.ffmpeg-ready"
    echo "tpu_setup: ffmpeg assembled from $n parts"
  fi
fi
if [ ! -f "$SITE/.ffmpeg-ready" ] && ! command -v ffmpeg >/dev/null; then
  # session 62: a server started without it lost every job at the write (now refused at start)
  echo "tpu_setup: no ffmpeg yet ($(ls /tmp/ffparts/ff.part[0-9]* 2>/dev/null | wc -l) of" \
    "$(cut -d' ' -f1 /tmp/ffparts/ff.parts 2>/dev/null || echo '?') parts here): nothing" \
    "that writes an mp4 (ditax generate, serve, tpu_video.py) can run in this call" >&2
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}:$SITE"
export PYTHONUNBUFFERED=1
