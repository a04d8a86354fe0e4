// The page of `ditax serve`: submit a job (POST /v1/videos), poll it (GET /v1/videos/ID) into
// the progress bar, play it when done, and list past jobs (GET /v1/videos) in the gallery, so a
// reload shows them again. Videos are fetched with the API key (if any) as blobs.
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

async function follow(id) {
  $("current").hidden = false;
  $("current_id").textContent = id;
  $("player").textContent = "";
  for (;;) {
    const job = await api("GET", "/v1/videos/" + id);
    $("progress").value = job.progress;
    $("progress_text").textContent = `${job.progress}% (${job.status})`;
    if (job.status === "completed") {
      $("player").appendChild(await videoElement(job));
      break;
    }
    if (job.status === "failed" || job.status === "cancelled") {
      $("message").textContent = job.error ? job.error.message : job.status;
      break;
    }
    await new Promise((r) => setTimeout(r, 150));
  }
  refresh();
}

async function refresh() {
  try {
    const health = await (await fetch("/health")).json();
    $("model").textContent = `${health.model} · ${health.platform} × ${health.devices} · queue ${health.queue_depth}`;
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
    const gallery = $("gallery");
    gallery.textContent = "";
    for (const job of list.data) {
      const card = document.createElement("div");
      card.className = "card";
      card.dataset.id = job.id;
      if (job.url) card.appendChild(await videoElement(job));
      const text = document.createElement("div");
      text.innerHTML = `<span class="status-${job.status}"></span><br><span class="muted"></span>`;
      text.children[0].textContent = `${job.status}${job.status === "in_progress" ? " " + job.progress + "%" : ""}`;
      text.children[2].textContent = `${job.prompt} · ${job.size} · ${job.object === "image" ? "image" : job.num_frames + " frames"} · seed ${job.seed}`;
      card.appendChild(text);
      gallery.appendChild(card);
    }
  } catch (e) {
    $("message").textContent = e.message;
  }
}

refresh();
