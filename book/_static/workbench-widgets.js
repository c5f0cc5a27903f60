// Glue between the vendored ipywidgets embedder (vendor/embed-amd.js) and this site. Loaded after
// vendor/require.js and before vendor/embed-amd.js on pages that carry saved widget state.
(function () {
  // 1. Each AMD module that embed-amd.js defines finds its fonts next to its own module URL, which
  //    RequireJS resolves relative to the page ("<page dir>/@jupyter-widgets/controls.js" -> fonts in
  //    "<page dir>/@jupyter-widgets/"). Map every module it defines into the folder this site serves the
  //    vendored files from, so that each resolves to "<vendor>/<name>.js" and finds its fonts there:
  //    nothing 404s and nothing leaves the site. (The modules are already defined; only their URLs change.)
  var self = document.currentScript;
  var vendor = new URL("vendor", self.src).href;
  var paths = { "@jupyter-widgets/html-manager/dist": vendor };
  ["base", "base7", "controls", "controls7", "html-manager"].forEach(function (name) {
    paths["@jupyter-widgets/" + name] = vendor + "/" + name;
  });
  window.require.config({ paths: paths });

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
