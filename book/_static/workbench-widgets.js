// Glue between the vendored ipywidgets embedder (vendor/embed-amd.js) and this site. Loaded after
// vendor/require.js and before vendor/embed-amd.js on pages that carry saved widget state.
(function () {
  // 1. The embedder finds its fonts next to its own module URL, which RequireJS resolves relative
  //    to the page ("<page dir>/@jupyter-widgets/html-manager/dist/"). Point that module path at
  //    the folder this site serves the vendored files from, so nothing 404s and nothing leaves the site.
  var self = document.currentScript;
  var vendor = new URL("vendor/", self.src).href;
  window.require.config({ paths: { "@jupyter-widgets/html-manager/dist": vendor.replace(/\/$/, "") } });

  // 2. The embedder typesets widget labels with MathJax 2's MathJax.Hub.Queue; Sphinx loads MathJax 3.
  //    Give it a MathJax 2-shaped entry point that calls MathJax 3 (deferred scripts, MathJax among
  //    them, have run by DOMContentLoaded; this listener is registered before the embedder's).
  document.addEventListener("DOMContentLoaded", function () {
    if (window.MathJax && !window.MathJax.Hub) {
      window.MathJax.Hub = {
        Queue: function () {
          if (window.MathJax.typesetPromise) { window.MathJax.typesetPromise(); }
        },
      };
    }
  });
})();
