# Split what the lent chip's machine lacks (.whl-tpu/, see docs/tpu_v5e.md "Running it") into
# two carries that each fit beside the checkout (~52 MB of the 64 MiB a call may carry):
#   .chip/a: the wheels + the first part of the xz-compressed ffmpeg  (carry it in call 1)
#   .chip/b: the other parts + imageio_ffmpeg's Python files         (carry it in a warm call)
# benchmarks/tpu_setup.sh installs the wheels from whichever carry has them, keeps the parts in
# /tmp/ffparts between calls (a warm machine keeps /tmp) and assembles ffmpeg once all are there.
#   bash benchmarks/tpu_carry.sh      # here, once; .chip/ is git-ignored (.git/info/exclude)
set -e
src=.whl-tpu/imageio_ffmpeg_pkg
xz=$(ls $src/*.xz | head -1)
rm -rf .chip && mkdir -p .chip/a .chip/b
cp .whl-tpu/*.whl .chip/a/
split -n 3 -d "$xz" .chip/ff.part
mv .chip/ff.part00 .chip/a/ && mv .chip/ff.part01 .chip/ff.part02 .chip/b/
cp -r $src/imageio_ffmpeg .chip/b/
for d in a b; do echo "3 $(basename "${xz%.xz}")" > .chip/$d/ff.parts; done
du -sb .chip/a .chip/b
