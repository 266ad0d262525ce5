"use strict";
// fleetctl ui: polls the read-only JSON API and redraws three tables. No framework, no build step.

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text == null ? "" : String(text);
  if (cls) td.className = cls;
  return td;
}

function fill(tableId, rows) {
  const body = document.querySelector("#" + tableId + " tbody");
  body.replaceChildren(...rows);
}

function secs(s) {
  if (s == null) return "?";
  s = Math.round(s);
  if (s < 100) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
}

function drawLive(live) {
  const title = document.getElementById("run-title");
  if (!live.log) {
    title.textContent = "no run yet";
    fill("run", []);
    return;
  }
  title.textContent = (live.ended ? "last run: " : "run in progress: ") + live.title + " (" + live.log + ")";
  let head = live.title + "  " + secs(live.elapsed);
  if (live.hosts_planned) {
    head += "  " + live.hosts_done + "/" + live.hosts_planned + " hosts done";
    if (live.hosts_failed) head += ", " + live.hosts_failed + " failed";
    if (!live.ended && live.hosts_done + live.hosts_failed < live.hosts_planned) {
      head += live.left == null ? "  time left: after the first step" : "  ~" + secs(live.left) + " left";
    }
  }
  document.getElementById("run-header").textContent = head;
  document.getElementById("run-fleet").textContent = live.fleet || "";
  const order = { trouble: 0, busy: 1, quiet: 2 };
  const hosts = live.hosts.slice().sort((a, b) => order[a.state] - order[b.state]);
  fill("run", hosts.map(h => {
    const tr = document.createElement("tr");
    tr.className = h.state;
    tr.dataset.host = h.host;
    const c = h.cells;
    const prog = cell("");
    if (h.fraction != null) {
      const bar = document.createElement("progress");
      bar.max = 1;
      bar.value = h.fraction;
      prog.append(bar, " ");
    }
    prog.append(c.figures || c.progress || "");
    tr.append(cell(c.host), cell(c.wave), cell(c.phase, "phase st-" + c.phase), cell(c.tag), cell(c.digest),
              cell(c.health), prog, cell(c.message, "message"));
    return tr;
  }));
}

function reportLink(run, host) {
  const a = document.createElement("a");
  a.href = "/report/" + encodeURIComponent(run) + "/" + encodeURIComponent(host);
  a.textContent = "report";
  return a;
}

function drawHosts(hosts) {
  fill("hosts", hosts.map(h => {
    const tr = document.createElement("tr");
    const last = h.last || {};
    const rep = cell("");
    if (last.run && last.kind === "rollout" && !["pending", "skipped"].includes(last.status)) {
      rep.append(reportLink(last.run, h.host));
    }
    tr.append(cell(h.host), cell(h.address), cell(h.groups.join(", ")), cell(h.recipe), cell(last.run),
              cell(last.status, "st-" + last.status), cell(last.tag), rep);
    return tr;
  }));
}

function drawHistory(history) {
  fill("history", history.map(r => {
    const tr = document.createElement("tr");
    const hosts = cell("");
    r.hosts.forEach((h, i) => {
      if (i) hosts.append(", ");
      const span = document.createElement("span");
      span.className = "st-" + h.status;
      span.textContent = h.host + " " + h.status;
      hosts.append(span);
      if (r.kind === "rollout" && h.status !== "skipped" && h.status !== "pending") {
        hosts.append(" (", reportLink(r.id, h.host), ")");
      }
    });
    tr.append(cell(r.id), cell(r.what || r.kind), cell(r.status, "st-" + r.status), cell(r.tag || r.requested),
              cell(r.started_at), cell(r.started_by), hosts);
    return tr;
  }));
}

async function get(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

let tick = 0;
async function refresh() {
  try {
    drawLive(await get("/api/live"));
    if (tick % 5 === 0) {
      drawHosts(await get("/api/hosts"));
      drawHistory(await get("/api/history"));
    }
    tick += 1;
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    document.getElementById("updated").textContent = "cannot reach fleetctl ui: " + e.message;
  }
}

refresh();
setInterval(refresh, 1000);
