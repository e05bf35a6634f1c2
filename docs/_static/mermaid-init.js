// Draws every <pre class="mermaid"> of the page with the bundled mermaid.js, then marks
// the body (data-mermaid="done" or "error") for the headless browser check.
window.addEventListener("DOMContentLoaded", function () {
  var blocks = document.querySelectorAll("pre.mermaid");
  if (blocks.length === 0) {
    document.body.dataset.mermaid = "none";
    return;
  }
  var dark = document.body.dataset.theme === "dark" ||
    (document.body.dataset.theme !== "light" &&
     window.matchMedia("(prefers-color-scheme: dark)").matches);
  mermaid.initialize({startOnLoad: false, theme: dark ? "dark" : "default",
                      securityLevel: "strict", maxTextSize: 200000, maxEdges: 2000});
  mermaid.run({nodes: blocks}).then(function () {
    document.body.dataset.mermaid = "done";
  }, function (err) {
    document.body.dataset.mermaid = "error";
    console.error("mermaid: " + ((err && (err.message || err.str)) || String(err)));
  });
});
