// panqueue dashboard: the live parts of the pages. Plain JS, no build step, no inline script
// (the Content-Security-Policy allows only this file). Everything from the server is put in
// the page with textContent, never as HTML. Times too come written by the server (one format,
// UTC): this script formats none of its own.
"use strict";

(function () {
  const body = document.body;
  const base = body.dataset.base || "";

  async function getJSON(path, params) {
    const query = new URLSearchParams(params || {}).toString();
    const response = await fetch(base + path + (query ? "?" + query : ""), {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    });
    if (!response.ok) {
      throw new Error("HTTP " + response.status);
    }
    return response.json();
  }

  function every(ms, tick) {
    async function loop() {
      try {
        await tick();
      } finally {
        setTimeout(loop, ms);
      }
    }
    setTimeout(loop, ms);
  }

  function setStatus(text) {
    const status = document.getElementById("live-status");
    if (status) {
      status.textContent = text;
    }
  }

  // Overview: counts, rates, lag, workers and paused, every 2 s.
  function overview() {
    const table = document.getElementById("queues");
    every(2000, async function () {
      let snap;
      try {
        snap = await getJSON("/api/overview");
      } catch (err) {
        setStatus("update failed: " + err.message);
        return;
      }
      const rows = new Map();
      table.querySelectorAll("tbody tr[data-queue]").forEach(function (tr) {
        rows.set(tr.dataset.queue, tr);
      });
      const same = snap.queues.length === rows.size &&
        snap.queues.every(function (q) { return rows.has(q.name); });
      if (!same) {
        window.location.reload(); // a queue appeared or went away: render the table again
        return;
      }
      for (const queue of snap.queues) {
        const tr = rows.get(queue.name);
        tr.querySelectorAll("[data-field]").forEach(function (cell) {
          const text = queue.cells[cell.dataset.field];
          if (text !== undefined && cell.textContent !== text) {
            cell.textContent = text;
          }
        });
        tr.querySelectorAll("form[data-show]").forEach(function (form) {
          form.hidden = (form.dataset.show === "paused") !== queue.paused;
        });
      }
      document.getElementById("worker-count").textContent = String(snap.workers);
      setStatus("updated " + snap.updated);
    });
  }

  // A job that is not finished: follow its state; show the new page once it changes.
  function job() {
    const live = document.getElementById("job-live");
    const finished = ["completed", "failed", "cancelled"];
    if (finished.includes(live.dataset.state)) {
      return;
    }
    every(1000, async function () {
      let found;
      try {
        found = await getJSON("/api/job", { q: live.dataset.queue, id: live.dataset.job });
      } catch (err) {
        return;
      }
      if (found.state !== live.dataset.state) {
        window.location.reload();
        return;
      }
      document.getElementById("job-attempts").textContent = String(found.attempts);
      // A percentage is a bar with its number; anything else its text alone.
      const bar = document.getElementById("job-progress-bar");
      bar.hidden = found.percent === null;
      bar.value = found.percent === null ? 0 : found.percent;
      document.getElementById("job-progress").textContent = found.progress;
    });
  }

  // A queue's event stream: new events on top, at most 200 rows.
  function events() {
    const table = document.getElementById("events");
    const tbody = table.querySelector("tbody");
    let position = table.dataset.position;
    every(1000, async function () {
      let found;
      try {
        found = await getJSON("/api/events", { q: table.dataset.queue, after: position });
      } catch (err) {
        setStatus("update failed: " + err.message);
        return;
      }
      position = found.position;
      for (const event of found.events) {
        const tr = document.createElement("tr");
        const details = event.fields.length > 200 ? event.fields.slice(0, 197) + "..." : event.fields;
        const cells = [event.time, event.type, event.job_id, details];
        cells.forEach(function (text, index) {
          const td = document.createElement("td");
          if (index === 1) {
            const span = document.createElement("span");
            span.className = "event event-" + text.replace(/[^a-z]/g, "");
            span.textContent = text;
            td.appendChild(span);
          } else if (index === 2 && text) {
            const a = document.createElement("a");
            a.href = base + "/job?" + new URLSearchParams({ q: table.dataset.queue, id: text });
            a.textContent = text;
            td.appendChild(a);
          } else {
            const code = document.createElement(index === 3 ? "code" : "span");
            code.textContent = text;
            td.appendChild(code);
          }
          tr.appendChild(td);
        });
        tbody.insertBefore(tr, tbody.firstChild);
      }
      while (tbody.rows.length > 200) {
        tbody.deleteRow(tbody.rows.length - 1);
      }
      setStatus("updated " + found.updated);
    });
  }

  // Queue list: the header's box selects or clears every job of the page.
  function queue() {
    const all = document.getElementById("select-all");
    if (!all) {
      return;
    }
    all.addEventListener("change", function () {
      document.querySelectorAll('input[type="checkbox"][name="id"]').forEach(function (box) {
        box.checked = all.checked;
      });
    });
  }

  const pages = { overview: overview, job: job, events: events, queue: queue };
  const start = pages[body.dataset.page];
  if (start) {
    start();
  }
})();
