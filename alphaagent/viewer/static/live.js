// A running turn's page: each run is added as the store records it (server-sent events); when the
// turn ends the page reloads to show its result. Every value is untrusted and is set as text only.
"use strict";
(function () {
  const live = document.getElementById("live");
  if (!live || !window.EventSource) return;
  const runs = document.getElementById("runs");
  const source = new EventSource(live.dataset.events);

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function stream(section, run, name) {
    const text = run[name];
    if (!text && !run[name + "_bytes"]) return;
    section.appendChild(element("h4", null, name + " (" + run[name + "_bytes"] + " bytes)"));
    section.appendChild(element("pre", "output " + name, text));
    if (run[name + "_truncated"]) {
      const marker = element("p", "marker", name + " truncated: " + run[name + "_bytes"] + " bytes in all ");
      const url = run[name + "_url"];
      if (url) {
        const link = element("a", null, "the full " + name);
        link.href = url;
        marker.appendChild(link);
      }
      section.appendChild(marker);
    }
  }

  function addRun(run) {
    for (const existing of runs.querySelectorAll("[data-run-id]")) {
      if (existing.dataset.runId === run.run_id) return;
    }
    const section = element("section", "run");
    section.dataset.runId = run.run_id;
    const title = element("h3", null, "run ");
    title.appendChild(element("code", null, run.run_id));
    title.appendChild(document.createTextNode(" "));
    title.appendChild(element("span", "status status-" + String(run.status).replace(/[^a-z]/g, ""), run.status));
    title.appendChild(element("span", "muted", " exit " + run.exit_code + " · " + run.duration_ms + " ms"));
    section.appendChild(title);
    const details = element("details");
    details.appendChild(element("summary", null, "code"));
    details.appendChild(element("pre", "code", run.code));
    section.appendChild(details);
    stream(section, run, "stdout");
    stream(section, run, "stderr");
    if (run.error) section.appendChild(element("p", "error", run.error));
    if (run.state) section.appendChild(element("p", "muted state", run.state));
    runs.appendChild(section);
  }

  source.addEventListener("run", function (event) { addRun(JSON.parse(event.data)); });
  source.addEventListener("turn", function (event) {
    const turn = JSON.parse(event.data);
    if (turn.status !== "running") {
      source.close();
      window.location.reload();
    }
  });
})();
