/* django-rtq's live admin pages: select all, selection count, copy buttons, local times and
   auto-refresh (counts and lists swapped in place; off unless turned on, remembered here). */
(function () {
  "use strict";
  var REFRESH_KEY = "django-rtq:auto-refresh";
  var REFRESH_MS = 5000;
  var timer = null;

  function rowBoxes() { return document.querySelectorAll("input.action-select[name=ids]"); }

  function updateSelection() {
    var boxes = rowBoxes(), checked = 0;
    boxes.forEach(function (box) { if (box.checked) { checked += 1; } });
    var count = document.getElementById("rtq-selected-count");
    if (count) { count.textContent = checked + " of " + boxes.length + " selected"; }
    var all = document.getElementById("rtq-select-all");
    if (all) {
      all.checked = boxes.length > 0 && checked === boxes.length;
      all.indeterminate = checked > 0 && checked < boxes.length;
    }
  }

  function localTimes(root) {
    root.querySelectorAll("time.rtq-time[data-epoch]").forEach(function (el) {
      var when = new Date(parseFloat(el.dataset.epoch) * 1000);
      if (!isNaN(when) && el.title.indexOf("browser:") === -1) {
        el.title = "browser: " + when.toLocaleString() + " · " + el.title;
      }
    });
  }

  function copy(button) {
    var pre = button.parentNode.querySelector("pre");
    var text = pre ? pre.textContent : "";
    function done() { button.textContent = "Copied"; setTimeout(function () { button.textContent = "Copy"; }, 1500); }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () { fallbackCopy(pre); done(); });
    } else {
      fallbackCopy(pre);
      done();
    }
  }

  function fallbackCopy(pre) {
    var range = document.createRange();
    range.selectNodeContents(pre);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    try { document.execCommand("copy"); } catch (e) { /* the text stays selected to copy by hand */ }
  }

  function refresh() {
    var request = new XMLHttpRequest();
    request.open("GET", window.location.href);
    request.setRequestHeader("X-RTQ-Refresh", "1");
    request.onload = function () {
      if (request.status !== 200) { return; }
      var fresh = new DOMParser().parseFromString(request.responseText, "text/html");
      var kept = {};
      rowBoxes().forEach(function (box) { if (box.checked) { kept[box.value] = true; } });
      document.querySelectorAll("[data-rtq-live]").forEach(function (el) {
        var replacement = el.id && fresh.getElementById(el.id);
        if (replacement) { el.replaceWith(document.importNode(replacement, true)); }
      });
      rowBoxes().forEach(function (box) { if (kept[box.value]) { box.checked = true; } });
      localTimes(document);
      updateSelection();
      document.documentElement.dataset.rtqRefreshed = String(Date.now());
    };
    request.send();
  }

  function setAutoRefresh(on) {
    if (timer) { clearInterval(timer); timer = null; }
    if (on) { timer = setInterval(refresh, REFRESH_MS); }
    try { window.localStorage.setItem(REFRESH_KEY, on ? "on" : "off"); } catch (e) { /* private mode */ }
  }

  document.addEventListener("change", function (event) {
    var target = event.target;
    if (target.id === "rtq-select-all") {
      rowBoxes().forEach(function (box) { box.checked = target.checked; });
      updateSelection();
    } else if (target.matches && target.matches("input.action-select[name=ids]")) {
      updateSelection();
    } else if (target.id === "rtq-auto-refresh") {
      setAutoRefresh(target.checked);
    }
  });

  document.addEventListener("click", function (event) {
    var target = event.target;
    if (target.classList && target.classList.contains("rtq-copy")) { copy(target); }
  });

  document.addEventListener("DOMContentLoaded", function () {
    var toggle = document.getElementById("rtq-auto-refresh");
    if (toggle) {
      var stored = null;
      try { stored = window.localStorage.getItem(REFRESH_KEY); } catch (e) { stored = null; }
      toggle.checked = stored === "on";
      if (toggle.checked) { setAutoRefresh(true); }
    }
    localTimes(document);
    updateSelection();
  });
}());
