"""The page of ``ditax serve`` plays a causal model's video while the rest is made (issue 59
item 3), in headless Chromium (the fixtures of :mod:`test_serve_browser`; skipped where no
Chromium is): a real server on the tiny causal folder (the demo model marked causal, chunks of
2 latent frames), a 61-frame job (8 chunks) submitted from the form; the current job's canvas
draws the first chunk's frames (fetched from the chunk event's ``url``) while the server
still reports the job in progress, then every frame of the video, before the mp4 replaces
it."""

from __future__ import annotations

import time

import pytest
import test_serve_browser
from causal_folders import causal_demo_folder
from serve_fixtures import Server, shared_cache
from test_serve_browser import wait_for

browser = test_serve_browser.browser        # its Chromium fixture (skips where there is none)

FRAMES = 61      # 16 latent frames: 8 chunks of 2


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve_browser_stream")
    folder = causal_demo_folder(root)
    srv = Server(root, "--max-batch", "1", model=folder,
                 cache=shared_cache(tmp_path_factory)).start()
    yield srv
    srv.stop()


def test_page_plays_chunks_before_the_job_completes(browser, server):
    from selenium.webdriver.common.by import By

    browser.get(server.url + "/")
    wait_for(lambda: "causal_demo" in browser.find_element(By.ID, "model").text, 30, "health")
    box = browser.find_element(By.ID, "num_frames")
    box.clear()
    box.send_keys(str(FRAMES))
    browser.find_element(By.ID, "submit").click()
    canvas = wait_for(lambda: [c for c in browser.find_elements(By.CSS_SELECTOR,
                                                               "#player canvas")
                               if int(c.get_attribute("data-frames") or 0) > 0], 120,
                      "the first chunk's frames on the canvas")[0]
    job_id = canvas.get_attribute("data-id")
    status, _, job = server.call("GET", f"/v1/videos/{job_id}")
    shown_at = time.time()
    assert status == 200 and job["status"] == "in_progress", job     # not yet completed
    assert job["progress"] < 100 and not browser.find_elements(By.CSS_SELECTOR,
                                                                "#player video")
    # a drawn frame: the decoded video's pixels, not a blank canvas
    spread = browser.execute_script(
        "const c = arguments[0], d = c.getContext('2d').getImageData(0, 0, c.width, c.height)"
        ".data; let lo = 255, hi = 0; for (let i = 0; i < d.length; i += 4) "
        "{ lo = Math.min(lo, d[i]); hi = Math.max(hi, d[i]); } return [d[3], hi - lo];", canvas)
    assert spread[0] == 255 and spread[1] > 0, spread
    done = server.wait(job_id)
    assert done["status"] == "completed", done
    video = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#player video"), 60,
                     "the mp4 after the streamed frames")[0]
    assert video.get_attribute("data-id") == job_id
    assert canvas.get_attribute("hidden") is not None          # the mp4 replaced it
    assert canvas.get_attribute("data-chunks") == "8"
    assert canvas.get_attribute("data-frames") == str(FRAMES)  # every frame was played
    first = int(canvas.get_attribute("data-first-frame-at")) / 1000
    assert first <= shown_at < done["completed_at"] + 1, (first, shown_at, done)
