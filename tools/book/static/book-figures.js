// Draw every plotly figure of the page with the site's own plotly.js: each div.book-figure holds the figure's
// JSON, as the notebook's output carried it (tools/book/build.py). No "Share chart" button: it would upload the
// figure to another site, and the book sends nothing anywhere.
document.addEventListener("DOMContentLoaded", () => {
  for (const box of document.querySelectorAll("div.book-figure")) {
    const fig = JSON.parse(box.querySelector("script").textContent);
    const plot = document.createElement("div");
    box.appendChild(plot);
    Plotly.newPlot(plot, fig.data, fig.layout, {responsive: true, displaylogo: false, showSendToCloud: false});
  }
});
