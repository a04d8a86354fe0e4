// The page of `ditax serve`: submit a job (POST /v1/videos), follow it live into the progress
// bar (Server-Sent Events of GET /v1/videos/ID/events), play it when done, and list past jobs
// (GET /v1/videos) in the gallery, so a reload shows them again; the gallery's unfinished jobs
// follow their events too. Videos are fetched with the API key (if any) as blobs.
// EventSource sends no headers, so with an API key the events URL carries it as ?key= (the
// only route that takes it there); a stream that fails before its first event (a proxy that
// drops event streams, an older server) falls back to polling GET /v1/videos/ID.
// A causal model's job streams: each finished chunk's event names its frames (chunk.url, one
// JPEG of chunk.count frames stacked top to bottom), which the current job's canvas plays at
// the video's frame rate while the rest is made; the mp4 replaces it once played through.
"use strict";
const $ = (id) => document.getElementById(id);
const keyInput = $("api_key");
keyInput.value = localStorage.getItem("ditax_api_key") || "";
keyInput.addEventListener("change", () => { localStorage.setItem("ditax_api_key", keyInput.value); refresh(); });

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (keyInput.value) h["Authorization"] = "Bearer " + keyInput.value;
  return h;
}

async function api(method, path, body) {
  const r = await fetch(path, { method, headers: headers(body ? { "Content-Type": "application/json" } : {}),
                                body: body ? JSON.stringify(body) : undefined });
  const data = await r.json();
  if (!r.ok) throw new Error((data.error && data.error.message) || r.statusText);
  return data;
}

async function videoElement(job) {
  // an image model's job (object "image") is a PNG: an <img> instead of a <video>
  const v = document.createElement(job.object === "image" ? "img" : "video");
  if (job.object === "image") v.alt = job.prompt;
  else { v.controls = true; v.loop = true; v.muted = true; v.autoplay = true; v.playsInline = true; }
  v.dataset.id = job.id;
  const r = await fetch(job.url, { headers: headers() });
  if (r.ok) v.src = URL.createObjectURL(await r.blob());
  return v;
}

function readImage(file) {
  return new Promise((resolve, reject) => {
    const fr = new FileReader();
    fr.onload = () => resolve(String(fr.result).split(",", 2)[1]);
    fr.onerror = () => reject(fr.error);
    fr.readAsDataURL(file);
  });
}

$("form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  $("message").textContent = "";
  const body = { prompt: $("prompt").value };
  if ($("negative_prompt").value) body.negative_prompt = $("negative_prompt").value;
  if ($("width").value || $("height").value) body.size = `${$("width").value || 0}x${$("height").value || 0}`;
  for (const k of ["num_frames", "num_inference_steps", "seed"]) if ($(k).value !== "") body[k] = parseInt($(k).value, 10);
  for (const k of ["guidance_scale", "true_cfg_scale"]) if ($(k).value !== "") body[k] = parseFloat($(k).value);
  if ($("image").files.length) body.image = await readImage($("image").files[0]);
  if ($("lora").value) body.loras = [{ name: $("lora").value, strength: parseFloat($("lora_strength").value || "1") }];
  $("submit").disabled = true;
  try {
    const job = await api("POST", "/v1/videos", body);
    follow(job.id);
  } catch (e) {
    $("message").textContent = e.message;
  } finally {
    $("submit").disabled = false;
  }
});

const FINISHED = ["completed", "failed", "cancelled"];
const GALLERY_STREAMS = 3;      // a browser opens 6 connections a host: leave some for the API
const streams = new Map();      // job id -> { source, via, listeners: Map(role -> fn(job)) }

// Call fn(job) now and at each change of job id's status or progress until it finishes; one
// stream a job, whoever listens (role: "current" or "gallery", the later fn of a role wins).
function watch(id, role, fn) {
  let s = streams.get(id);
  if (!s) {
    s = { source: null, via: "events", got: false, listeners: new Map() };
    streams.set(id, s);
    const key = keyInput.value ? "?key=" + encodeURIComponent(keyInput.value) : "";
    const source = new EventSource(`/v1/videos/${id}/events${key}`);
    s.source = source;
    source.onmessage = (ev) => { s.got = true; deliver(id, JSON.parse(ev.data)); };
    source.onerror = () => {
      // after its first event the browser reconnects by itself (a server restart); a stream
      // refused outright (401, 404, not an event stream) or never started: poll instead
      if (s.got && source.readyState !== EventSource.CLOSED) return;
      source.close();
      if (streams.get(id) === s) poll(id, s);
    };
  }
  s.listeners.set(role, fn);
}

function unwatch(id, role) {
  const s = streams.get(id);
  if (!s) return;
  s.listeners.delete(role);
  if (s.listeners.size === 0) {
    if (s.source) s.source.close();
    streams.delete(id);
  }
}

function deliver(id, job) {
  const s = streams.get(id);
  if (!s) return;
  if (FINISHED.includes(job.status)) {
    if (s.source) s.source.close();
    streams.delete(id);
  }
  for (const fn of s.listeners.values()) fn(job, s.via);
}

async function poll(id, s) {
  s.source = null;
  s.via = "polling";
  while (streams.get(id) === s) {
    let job;
    try {
      job = await api("GET", "/v1/videos/" + id);
    } catch (e) {
      $("message").textContent = e.message;
      streams.delete(id);
      return;
    }
    deliver(id, job);
    await new Promise((r) => setTimeout(r, 300));
  }
}

// The frames of a streaming job's chunks, drawn in order on a canvas at `fps`: add(chunk)
// queues a chunk's frames (fetched with the key), done() resolves once every queued frame was
// drawn. The canvas records what it showed: data-chunks (fetched), data-frames (drawn),
// data-first-frame-at (Date.now() at the first frame drawn).
function chunkPlayer(job) {
  const canvas = document.createElement("canvas");
  canvas.width = job.width;
  canvas.height = job.height;
  canvas.className = "stream";
  canvas.dataset.id = job.id;
  canvas.dataset.chunks = "0";
  canvas.dataset.frames = "0";
  const ctx = canvas.getContext("2d");
  const queue = [];                       // [bitmap, row] per frame not yet drawn
  let fetched = Promise.resolve(), timer = null, idle = [], next = 0;
  function tick() {
    const frame = queue.shift();
    if (!frame) {
      clearInterval(timer);
      timer = null;
      for (const fn of idle.splice(0)) fn();
      return;
    }
    const [bitmap, row] = frame;
    ctx.drawImage(bitmap, 0, row * canvas.height, canvas.width, canvas.height, 0, 0, canvas.width, canvas.height);
    if (canvas.dataset.frames === "0") canvas.dataset.firstFrameAt = String(Date.now());
    canvas.dataset.frames = String(Number(canvas.dataset.frames) + 1);
  }
  return {
    canvas,
    add(chunk) {
      // a reconnected stream sends the job's chunks again from the first: each plays once
      if (chunk.index < next) return fetched;
      next = chunk.index + 1;
      // fetched one after another, so the frames queue in chunk order
      fetched = fetched.then(async () => {
        const r = await fetch(chunk.url, { headers: headers() });
        if (!r.ok) return;                // no longer kept: the mp4 will show it
        const bitmap = await createImageBitmap(await r.blob());
        for (let row = 0; row < chunk.count; row++) queue.push([bitmap, row]);
        canvas.dataset.chunks = String(Number(canvas.dataset.chunks) + 1);
        if (!timer) { tick(); timer = setInterval(tick, 1000 / (job.fps || 16)); }
      }).catch(() => {});
      return fetched;
    },
    done() {
      return fetched.then(() => timer ? new Promise((r) => idle.push(r)) : undefined);
    },
  };
}

let current = null;

function follow(id) {
  if (current) unwatch(current, "current");
  current = id;
  $("current").hidden = false;
  $("current_id").textContent = id;
  $("player").textContent = "";
  $("progress").value = 0;
  let player = null;                         // a causal model's job: its chunks' canvas
  watch(id, "current", async (job, via) => {
    if (current !== id) return;
    $("progress").value = job.progress;
    $("progress").dataset.via = via;         // how the page hears of it (events | polling)
    $("progress_text").textContent = `${job.progress}% (${job.status})`;
    if (job.chunk && job.chunk.url) {
      if (!player) {
        player = chunkPlayer(job);
        $("player").appendChild(player.canvas);
      }
      player.add(job.chunk);
    }
    if (job.status === "completed") {
      const video = await videoElement(job);
      if (player) await player.done();       // the streamed frames first, then the mp4
      if (current !== id) return;
      if (player) player.canvas.hidden = true;     // kept: what it showed (data-*)
      $("player").appendChild(video);
    }
    else if (job.status === "failed" || job.status === "cancelled") {
      $("message").textContent = job.error ? job.error.message : job.status;
    }
    if (FINISHED.includes(job.status)) refresh();
  });
  refresh();
}

// a gallery card's live part: its status line and, while unfinished, a progress bar
function showCard(card, job) {
  const status = card.querySelector(".status");
  status.className = `status status-${job.status}`;
  status.textContent = `${job.status}${job.status === "in_progress" ? " " + job.progress + "%" : ""}`;
  let bar = card.querySelector("progress");
  if (!FINISHED.includes(job.status)) {
    if (!bar) {
      bar = document.createElement("progress");
      bar.max = 100;
      card.insertBefore(bar, card.firstChild);
    }
    bar.value = job.progress;
  } else if (bar) bar.remove();
}

// one refresh at a time (a second call while one runs: once more after it)
let refreshing = null, again = false;
function refresh() {
  if (refreshing) { again = true; return refreshing; }
  refreshing = render().finally(() => {
    refreshing = null;
    if (again) { again = false; refresh(); }
  });
  return refreshing;
}

async function render() {
  try {
    const health = await (await fetch("/health")).json();
    $("model").textContent = `${health.model} · ${health.platform} × ${health.devices} · queue ${health.queue_depth}` +
      (health.status === "ok" ? "" : ` · ${health.status}`);     // "warming": --warm compiles
    // only the inputs the served model's family takes (an image model has no frames)
    if (health.fields) for (const id of ["negative_prompt", "num_frames", "num_inference_steps", "guidance_scale", "true_cfg_scale", "seed", "image"]) {
      const on = health.fields.includes(id);
      $(id).closest("label").style.display = on ? "" : "none";   // the stylesheet sets display
      if (!on) $(id).value = "";
    }
    const loras = await api("GET", "/v1/loras");
    const select = $("lora");
    if (select.options.length !== loras.data.length + 1) {
      select.length = 1;
      for (const l of loras.data) select.add(new Option(l.name, l.name));
    }
    select.disabled = loras.data.length === 0;
    const list = await api("GET", "/v1/videos?limit=24");
    const cards = [];
    for (const job of list.data) {
      const card = document.createElement("div");
      card.className = "card";
      card.dataset.id = job.id;
      if (job.url) card.appendChild(await videoElement(job));
      const text = document.createElement("div");
      text.innerHTML = `<span class="status"></span><br><span class="muted"></span>`;
      text.children[2].textContent = `${job.prompt} · ${job.size} · ${job.object === "image" ? "image" : job.num_frames + " frames"} · seed ${job.seed}`;
      card.appendChild(text);
      showCard(card, job);
      cards.push([card, job]);
    }
    // the unfinished jobs shown follow their events (the oldest first, a few at a time: the
    // others are followed as those finish and the gallery is drawn again)
    const live = cards.filter(([, job]) => !FINISHED.includes(job.status)).reverse()
      .slice(0, GALLERY_STREAMS);
    const ids = new Set(live.map(([, job]) => job.id));
    for (const [id, s] of [...streams]) {
      if (s.listeners.has("gallery") && !ids.has(id)) unwatch(id, "gallery");
    }
    for (const [card, job] of live) {
      watch(job.id, "gallery", (j) => {
        showCard(card, j);
        if (FINISHED.includes(j.status)) refresh();
      });
    }
    $("gallery").replaceChildren(...cards.map(([card]) => card));
  } catch (e) {
    $("message").textContent = e.message;
  }
}

refresh();
