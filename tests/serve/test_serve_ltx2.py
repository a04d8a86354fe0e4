"""``ditax serve`` on an LTX-2 folder: a job's mp4 carries its AAC sound track (no separate
audio file, so ``?variant=audio`` is refused naming what there is), at the request's frame
rate and length."""

from serve_fixtures import Server

from ditax.io.audio import read_audio
from ditax.io.video import read_video
from ltx2_pipeline_reference import shared_ltx2_pipeline


def test_job_returns_the_mp4_with_its_sound(tmp_path):
    root, _ = shared_ltx2_pipeline()
    srv = Server(tmp_path / "srv", "--max-batch", "1", model=str(root)).start()
    try:
        body = {"prompt": "waves on a drum", "size": "32x32", "num_frames": 9, "seed": 2,
                "num_inference_steps": 2, "frame_rate": 12.0}
        status, _, job = srv.call("POST", "/v1/videos", body)
        assert status == 200, job
        done = srv.wait(job["id"])
        assert done["status"] == "completed", done
        status, head, data = srv.call("GET", done["url"])
        assert status == 200
        path = tmp_path / "job.mp4"
        path.write_bytes(data)
        assert read_video(path).shape == (9, 32, 32, 3)
        import imageio.v2 as imageio

        with imageio.get_reader(str(path), format="FFMPEG") as r:    # at the request's rate
            assert abs(r.get_meta_data()["fps"] - 12.0) < 1e-6
        track = read_audio(path)
        assert track is not None and track.channels == 2 and track.sample_rate == 8000
        assert abs(track.seconds - 9 / 12) < 0.1, track.seconds
        status, _, err = srv.call("GET", done["url"] + "?variant=audio")
        assert status == 400 and "have video" in err["error"]["message"], err
    finally:
        srv.stop()
