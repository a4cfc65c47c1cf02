// A run's page follows its trace: while it runs (or while this UI drives it) it asks every half second for the
// events since the last it has, appends them (rendered and escaped by the server), shows the reply streaming in and
// what its command prints (both rendered by the server),
// and swaps in the run's controls (a question, Stop, follow up, resume) when they change. No reload. A run that
// is gone (refused at its first request: not kept) says so, with what its process said, and the polling stops.
(function () {
  const box = document.getElementById("events");
  if (!box) return;
  let count = Number(box.dataset.count || 0);
  let status = box.dataset.status;
  let live = box.dataset.live === "yes";
  let controlKey = box.dataset.control;
  async function poll() {
    try {
      const response = await fetch(`/runs/${encodeURIComponent(box.dataset.run)}/events?after=${count}`,
                                    {credentials: "same-origin"});
      if (response.status === 404) {  // the run is gone: one refused at its first request is not kept
        const data = await response.json().catch(() => ({}));
        const gone = document.createElement("p"), log = document.createElement("pre");
        gone.className = "message";
        gone.id = "missing";
        gone.textContent = data.error || "this run is gone";
        log.className = "log";
        log.textContent = data.log || "";
        document.getElementById("status").textContent = "not kept";
        box.replaceChildren(gone, ...(data.log ? [log] : []));
        return;
      }
      if (response.ok) {
        const data = await response.json();
        if (data.count > count) {
          const chunk = document.createElement("template");
          chunk.innerHTML = data.html;  // rendered and escaped by the server
          // a step begun again after a resume is shown once: as it is done now
          chunk.content.querySelectorAll("section.step[id]").forEach((step) => {
            const before = box.querySelector(`section.step[id="${step.id}"]`);
            if (before) before.remove();
          });
          box.append(chunk.content);
          count = data.count;
          document.getElementById("chart").innerHTML = data.chart;
        }
        status = data.status;
        live = data.live;
        document.getElementById("meta").innerHTML = data.meta;
        document.getElementById("now").innerHTML = data.now;  // rendered and escaped by the server
        if (data.answer !== null && data.answer !== undefined) {
          const answer = document.getElementById("answer");
          if (!answer.querySelector(".text")) {  // the answer's Markdown, rendered (raw HTML off) by the server
            answer.innerHTML = `<h2>answer</h2><div class="text">${data.answer}</div>`;
            answer.className = "answer";
          }
        }
        if (data.control_key !== controlKey) {
          controlKey = data.control_key;
          document.getElementById("control").innerHTML = data.control;
        }
      }
    } catch (error) { /* the server restarted: try again */ }
    if (status === "running" || live) setTimeout(poll, 500);
  }
  if (status === "running" || live) setTimeout(poll, 500);
})();
