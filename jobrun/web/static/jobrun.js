/* jobrun dashboard: live regions without a full reload.
 *
 * An element with data-refresh-url is fetched again every
 * data-refresh-seconds (default 5) and its content replaced by the fragment
 * the server renders (escaped server-side; a script in it would not run,
 * and the Content-Security-Policy allows no inline script anyway). Nothing
 * is fetched while the tab is hidden or while the pointer is pressed inside
 * the region, nor while a previous fetch is still out. The element gets
 * data-refresh-count (refreshes applied) and the class "stale" while the
 * last one failed. Without this script every page still works; it only
 * stops refreshing itself.
 */
(function () {
  "use strict";

  function refresh(el, state) {
    if (state.busy || state.pressed || document.hidden) {
      return;
    }
    var url = el.getAttribute("data-refresh-url");
    if (!url) {
      return;
    }
    state.busy = true;
    fetch(url, { credentials: "same-origin", headers: { "X-Jobrun-Live": "1" } })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        if (!state.pressed) {
          el.innerHTML = html;
          state.count += 1;
          el.setAttribute("data-refresh-count", String(state.count));
        }
        el.classList.remove("stale");
      })
      .catch(function () {
        el.classList.add("stale");
      })
      .then(function () {
        state.busy = false;
      });
  }

  function start() {
    var regions = document.querySelectorAll("[data-refresh-url]");
    Array.prototype.forEach.call(regions, function (el) {
      var seconds = parseFloat(el.getAttribute("data-refresh-seconds"));
      if (!(seconds >= 1)) {
        seconds = 5;
      }
      var state = { busy: false, pressed: false, count: 0 };
      el.setAttribute("data-refresh-count", "0");
      el.addEventListener("pointerdown", function () { state.pressed = true; });
      document.addEventListener("pointerup", function () { state.pressed = false; });
      window.setInterval(function () { refresh(el, state); }, seconds * 1000);
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
