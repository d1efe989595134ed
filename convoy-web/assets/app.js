// convoy operator page: refreshes every element with a data-live URL on
// each server-sent "tick" (the server bounds the rate). No inline script:
// the Content-Security-Policy allows only this file.
(function () {
  "use strict";
  var live = document.querySelectorAll("[data-live]");
  if (!live.length || !window.EventSource) return;
  var base = document.body.getAttribute("data-base") || "";
  var source = new EventSource(base + "/events");
  var busy = false;
  source.addEventListener("tick", function () {
    if (busy || document.hidden) return;
    busy = true;
    var jobs = Array.prototype.map.call(live, function (el) {
      return fetch(el.getAttribute("data-live"), { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) { if (html !== null) el.innerHTML = html; })
        .catch(function () {});
    });
    Promise.all(jobs).then(function () { busy = false; });
  });
})();
