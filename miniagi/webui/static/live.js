// A running run's page follows its trace: every second it asks for the events since the last it has, appends them
// (rendered and escaped by the server) and stops once the run has ended. No reload.
(function () {
  const box = document.getElementById("events");
  if (!box) return;
  let count = Number(box.dataset.count || 0);
  let status = box.dataset.status;
  async function poll() {
    try {
      const response = await fetch(`/runs/${encodeURIComponent(box.dataset.run)}/events?after=${count}`);
      if (response.ok) {
        const data = await response.json();
        if (data.count > count) {
          box.insertAdjacentHTML("beforeend", data.html);
          count = data.count;
          document.getElementById("chart").innerHTML = data.chart;
        }
        status = data.status;
        document.getElementById("meta").innerHTML = data.meta;
      }
    } catch (error) { /* the server restarted: try again */ }
    if (status === "running") setTimeout(poll, 1000);
  }
  if (status === "running") setTimeout(poll, 1000);
})();
