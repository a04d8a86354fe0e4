"""The page of ``ditax serve`` in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, installed by ``.ci/run``) driven by selenium opens ``/``, submits a prompt,
sees the progress bar move — fed by the job's event stream (``EventSource`` on
``/v1/videos/ID/events``, not polling), in the current-job bar and in the job's gallery card
alike — end at 100 (completed), a ``<video>`` that the browser can play (``readyState`` >= 1,
``duration`` > 0), and the job in the gallery after a reload. A screenshot of the page is saved
in the test's folder (``DITAX_UPDATE_SCREENSHOT=1`` also copies it to docs/serve_page.png, the
README's)."""

from __future__ import annotations

import os
import pathlib
import shutil
import time

import pytest
from serve_fixtures import LONG, Server, shared_cache, write_lora

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
DRIVERS = ("chromedriver", "/usr/lib/chromium/chromedriver")
DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "serve_page.png"


def find(names):
    return next((shutil.which(n) for n in names if shutil.which(n)), None)


@pytest.fixture(scope="module")
def browser():
    binary, driver_path = find(BROWSERS), find(DRIVERS)
    if binary is None or driver_path is None:
        pytest.skip(f"no Chromium here (looked for {', '.join(BROWSERS)} and chromedriver): "
                    f"apt-get install chromium chromium-driver (.ci/run does)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,800", "--autoplay-policy=no-user-gesture-required"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve_browser")
    (folder / "loras").mkdir()
    write_lora(folder / "loras" / "tiny.safetensors")
    srv = Server(folder, "--max-batch", "1", "--lora-dir", str(folder / "loras"),
                 cache=shared_cache(tmp_path_factory)).start()
    yield srv
    srv.stop()


def wait_for(fn, timeout=120.0, what="condition"):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        value = fn()
        if value:
            return value
        time.sleep(0.03)
    raise AssertionError(f"timed out waiting for {what}")


def test_page_submit_progress_video_gallery(browser, server, tmp_path):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    browser.get(server.url + "/")
    wait_for(lambda: "demo_model" in browser.find_element(By.ID, "model").text, 30, "health")
    width, height = LONG["size"].split("x")
    for field, value in (("width", width), ("height", height),
                         ("num_frames", LONG["num_frames"]),
                         ("num_inference_steps", LONG["num_inference_steps"]), ("seed", 5)):
        box = browser.find_element(By.ID, field)
        box.clear()
        box.send_keys(str(value))
    browser.find_element(By.ID, "submit").click()
    bar = browser.find_element(By.ID, "progress")
    seen, in_card = set(), set()
    video = None
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120:
        seen.add(int(float(bar.get_attribute("value"))))
        try:    # the gallery re-renders its cards as jobs move: a card may go mid-read
            in_card.update(int(float(p.get_attribute("value"))) for p in browser.find_elements(
                By.CSS_SELECTOR, ".card progress"))
        except StaleElementReferenceException:
            pass
        found = browser.find_elements(By.CSS_SELECTOR, "#player video")
        if found:
            video = found[0]
            break
        time.sleep(0.02)
    assert video is not None, browser.find_element(By.ID, "message").text
    assert any(0 < p < 100 for p in seen), sorted(seen)      # the bar moved on the way
    assert any(0 < p < 100 for p in in_card), sorted(in_card)   # the gallery card's too
    assert bar.get_attribute("data-via") == "events"         # from the event stream
    assert int(float(bar.get_attribute("value"))) == 100
    assert browser.find_element(By.ID, "progress_text").text == "100% (completed)"
    state = wait_for(lambda: browser.execute_script(
        "const v = arguments[0]; return v.readyState >= 1 && v.duration > 0 ? "
        "[v.readyState, v.duration] : null", video), 30, "the video to load")
    assert state[0] >= 1 and state[1] > 0
    job_id = video.get_attribute("data-id")
    assert server.wait(job_id)["status"] == "completed"
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f'.card[data-id="{job_id}"]'), 30,
             "the gallery before the reload")
    shot = tmp_path / "serve_page.png"          # the artifact: form, progress, video, gallery
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 1000
    if os.environ.get("DITAX_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, DOCS)
    browser.refresh()
    card = wait_for(lambda: browser.find_elements(
        By.CSS_SELECTOR, f'.card[data-id="{job_id}"] video'), 30, "the gallery")[0]
    wait_for(lambda: browser.execute_script(
        "return arguments[0].readyState >= 1 && arguments[0].duration > 0", card), 30,
        "the gallery video to load")
    assert browser.save_screenshot(str(tmp_path / "serve_page_reloaded.png"))


def test_page_with_an_api_key_follows_events(browser, tmp_path_factory):
    """With ``--api-key`` the page's event streams carry the key as ``?key=`` (EventSource
    sends no header): the bar still follows the events, not polling."""
    from selenium.webdriver.common.by import By

    key = "page-key"
    srv = Server(tmp_path_factory.mktemp("serve_browser_key"), "--max-batch", "1", "--api-key",
                 key, cache=shared_cache(tmp_path_factory)).start()
    try:
        browser.get(srv.url + "/")
        box = browser.find_element(By.ID, "api_key")
        box.send_keys(key)
        browser.execute_script("arguments[0].dispatchEvent(new Event('change'))", box)
        width, height = LONG["size"].split("x")
        for field, value in (("width", width), ("height", height),
                             ("num_frames", LONG["num_frames"]),
                             ("num_inference_steps", LONG["num_inference_steps"])):
            box = browser.find_element(By.ID, field)
            box.clear()
            box.send_keys(str(value))
        browser.find_element(By.ID, "submit").click()
        text = browser.find_element(By.ID, "progress_text")
        # the page writes "completed" first, then fetches the video (with the key) and shows it
        wait_for(lambda: text.text == "100% (completed)"
                 and browser.find_elements(By.CSS_SELECTOR, "#player video"), 120,
                 f"the job to complete and its video to show (page says {text.text!r}, "
                 f"{browser.find_element(By.ID, 'message').text!r})")
        bar = browser.find_element(By.ID, "progress")
        assert bar.get_attribute("data-via") == "events"
    finally:
        srv.stop()
