// billing-inbox console: the key kept in this tab, each page's fragment fetched with it, the
// admin actions posted, the Engine Room driven. No framework, nothing fetched from elsewhere,
// no inline code (the console's Content-Security-Policy allows only this file).
(function () {
  "use strict";

  var KEY = "billing-inbox-key";
  var match = /^(.*?)\/console(?:\/(.*))?$/.exec(location.pathname) || [null, "", ""];
  var base = match[1];
  var rest = match[2] || "";
  var page = document.getElementById("page");
  var flash = document.getElementById("flash");

  function getKey() {
    try { return sessionStorage.getItem(KEY); } catch (e) { return null; }
  }
  function setKey(key) { sessionStorage.setItem(KEY, key); }
  function forgetKey() {
    try { sessionStorage.removeItem(KEY); } catch (e) { /* nothing kept */ }
  }

  function say(text, tone) {
    flash.textContent = text;
    flash.className = text ? "shown tone-" + (tone || "plain") : "";
  }

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (name) { node.setAttribute(name, attrs[name]); });
    (children || []).forEach(function (child) {
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    });
    return node;
  }

  function encode(segment) { return encodeURIComponent(segment); }

  // --- the key -----------------------------------------------------------------------------
  function showKeyForm(message) {
    page.textContent = "";
    document.title = "Open the console · billing-inbox";
    var input = el("input", { id: "api-key", type: "password", autocomplete: "off", required: "" });
    page.appendChild(el("h1", {}, ["Open the console"]));
    if (message) { page.appendChild(el("p", { "class": "note tone-bad", role: "alert" }, [message])); }
    page.appendChild(el("form", { id: "key-form" }, [
      el("label", { "for": "api-key" }, ["API key"]), input,
      el("button", { type: "submit" }, ["Open"])
    ]));
    page.appendChild(el("p", { "class": "meta" }, [
      "The key stays in this tab only: closing the tab, or Forget key, drops it."
    ]));
    page.removeAttribute("aria-busy");
    page.setAttribute("data-state", "key");
    input.focus();
  }

  function refused() {
    forgetKey();
    showKeyForm("That key was refused (401 unauthorized): enter another.");
  }

  // A key the API knows but that lacks the admin scope: the console's pages need one that has
  // it, so the form is offered again (the key is dropped, as a refused one is).
  function notAdmin() {
    forgetKey();
    showKeyForm("That key has no admin scope (403 forbidden): the console's pages need an " +
      "admin key. Enter another.");
  }

  // --- the page's fragment -------------------------------------------------------------------
  function localTimes(root) {
    Array.prototype.forEach.call(root.querySelectorAll("time[datetime]"), function (t) {
      var at = new Date(t.getAttribute("datetime"));
      if (!isNaN(at.getTime())) { t.title = at.toLocaleString() + " (your local time)"; }
    });
  }

  function showError(code, detail) {
    page.textContent = "";
    page.appendChild(el("div", { id: "error", role: "alert" }, [el("strong", {}, [code]), " " + detail]));
  }

  function load() {
    var key = getKey();
    if (!key) { showKeyForm(); return; }
    page.setAttribute("aria-busy", "true");
    page.setAttribute("data-state", "loading");
    fetch(base + "/console/fragment/" + rest + location.search, {
      headers: { Authorization: "Bearer " + key },
      cache: "no-store",
      credentials: "omit"
    }).then(function (answer) {
      return answer.text().then(function (body) {
        if (answer.status === 401) { refused(); return; }
        if (answer.status === 403 && /forbidden/.test(body)) { notAdmin(); return; }
        var type = answer.headers.get("content-type") || "";
        if (type.indexOf("text/html") === 0) {
          page.innerHTML = body;
        } else {
          showError(String(answer.status), body.slice(0, 300));
        }
        localTimes(page);
        openWhy(location.hash);
        var h1 = page.querySelector("h1");
        document.title = (h1 ? h1.textContent + " · " : "") + "billing-inbox console";
        page.removeAttribute("aria-busy");
        page.setAttribute("data-state", answer.ok ? "ready" : "error");
      });
    }).catch(function (e) {
      showError("unreachable", "the console could not reach the API (" + e.message + ")");
      page.removeAttribute("aria-busy");
      page.setAttribute("data-state", "error");
    });
  }

  // --- the admin API -------------------------------------------------------------------------
  // Resolves with the JSON answer; rejects with an Error whose message is "code: detail".
  function call(method, url, body) {
    var headers = { Authorization: "Bearer " + (getKey() || "") };
    if (body !== undefined) { headers["Content-Type"] = "application/json"; }
    return fetch(url, {
      method: method, headers: headers, cache: "no-store", credentials: "omit",
      body: body === undefined ? undefined : JSON.stringify(body)
    }).then(function (answer) {
      return answer.text().then(function (text) {
        var json = null;
        try { json = JSON.parse(text); } catch (e) { json = null; }
        if (answer.status === 401) { refused(); }
        if (answer.status === 403 && json && json.code === "forbidden") { notAdmin(); }
        if (!answer.ok) {
          var error = new Error(json && json.code
            ? json.code + ": " + json.detail
            : answer.status + " " + text.slice(0, 200));
          error.status = answer.status;
          throw error;
        }
        return json;
      });
    });
  }

  function post(form) {
    var body = {};
    var any = false;
    new FormData(form).forEach(function (value, name) {
      if (value !== "") { body[name] = String(value); any = true; }
    });
    var buttons = form.querySelectorAll("button");
    Array.prototype.forEach.call(buttons, function (b) { b.disabled = true; });
    say("Working…", "wait");
    call("POST", form.getAttribute("action"), any ? body : undefined).then(function (json) {
      say(told(json), "good");
      load();
    }, function (error) {
      if (error.status === 401 || error.status === 403) { return; }
      say("Refused: " + error.message, "bad");
      Array.prototype.forEach.call(buttons, function (b) { b.disabled = false; });
    });
  }

  // A replay's answer in words (the admin API's JSON: docs/api.md).
  function told(json) {
    if (!json) { return "Done."; }
    if (json.event_id !== undefined) {
      return "Replayed event #" + json.event_id + ": it is " + json.status + " now; the worker applies it again.";
    }
    if (json.report_id !== undefined) {
      return "Replayed meter report " + json.report_id + ": it is " + json.status + " now; the dispatcher sends it again.";
    }
    if (json.effect_id !== undefined) {
      return "Replayed effect " + json.effect_id + ": it is " + json.status + " now; the dispatcher tells the app again.";
    }
    if (json.replayed !== undefined) {
      return "Replayed " + json.replayed + " event(s)" +
        (json.more ? "; more are left: replay again." : ".");
    }
    return "Done.";
  }

  // A Why row named by a link's address (#why-…) is opened, so that what it explains shows.
  function openWhy(hash) {
    if (!hash || hash.indexOf("#why-") !== 0) { return; }
    var row = document.getElementById(hash.slice(1));
    if (row && row.tagName === "DETAILS") { row.open = true; }
  }

  // A console GET form: its non-empty fields as the query (a datetime-local field marked
  // data-utc is read as UTC and sent as RFC 3339).
  function navigate(form) {
    var params = new URLSearchParams();
    Array.prototype.forEach.call(form.elements, function (field) {
      if (!field.name || field.disabled || field.value === "") { return; }
      var value = field.value;
      if (field.hasAttribute("data-utc")) {
        value = (value.length === 16 ? value + ":00" : value) + "Z";
      }
      params.append(field.name, value);
    });
    var query = params.toString();
    location.assign(form.getAttribute("action") + (query ? "?" + query : ""));
  }

  // --- the Engine Room -----------------------------------------------------------------------
  function state(s) {
    if (!s) { return "—"; }
    return "plan " + s.plan + ", balance " + s.balance + (s.status ? ", " + s.status : "");
  }

  // The fields of two account lines that differ; a status either side lacks ("-", a
  // placeholder) is not compared.
  function differing(account, onArrival) {
    if (!account || !onArrival) { return []; }
    return ["plan", "balance", "status"].filter(function (field) {
      var a = account[field];
      var b = onArrival[field];
      if (field === "status" && (a === "-" || b === "-")) { return false; }
      return String(a) !== String(b);
    });
  }

  function setupRow(what) {
    return el("tr", { "data-step": "setup" }, [
      el("th", { scope: "row" }, ["setup"]),
      el("td", { colspan: "5" }, ["Sent with step 1, before it, and not a step of its own: " + what +
        ". Step 1's account includes it (its grant counts toward step 1's)."])
    ]);
  }

  function stepRow(step) {
    var event = step.event;
    var eventCell = event
      ? [el("a", { href: base + "/console/events/" + event.event_id }, ["#" + event.event_id]),
         " " + event.status + (event.outcome && event.outcome !== event.status ? " · " + event.outcome : "") +
         (event.reason ? " — " + event.reason : "")]
      : ["no event stored"];
    var answer = step.answer || {};
    var differs = differing(step.account, step.on_arrival);
    return el("tr", { "data-step": String(step.step) }, [
      el("th", { scope: "row" }, [String(step.step)]),
      el("td", {}, [step.what || ""]),
      el("td", {}, [String(answer.status) + (answer.verdict ? " " + answer.verdict : "")]),
      el("td", {}, eventCell),
      el("td", {}, [state(step.account)]),
      el("td", differs.length ? { "class": "differs", "data-differs": differs.join(" ") } : {},
        [state(step.on_arrival) + (differs.length ? " (differs: " + differs.join(", ") + ")" : "")])
    ]);
  }

  function runEngine(button) {
    var form = document.getElementById("engine-form");
    var scenario = document.getElementById("scenario").value;
    var body = document.querySelector("#engine-steps tbody");
    var result = document.getElementById("engine-result");
    button.disabled = true;
    body.textContent = "";
    result.textContent = "Starting " + scenario + "…";
    ["data-plan", "data-balance", "data-arrival-plan", "data-arrival-balance"].forEach(function (a) {
      result.removeAttribute(a);
    });
    var last = null;
    var chosen = document.querySelector("#scenario option:checked");
    var setup = chosen && chosen.getAttribute("data-setup");
    call("POST", form.getAttribute("data-runs"), { scenario: scenario }).then(function (run) {
      if (setup) { body.appendChild(setupRow(setup)); }
      var where = run.source + "/" + run.customer;
      function step(n) {
        if (n > run.steps) { return null; }
        result.textContent = "Delivering " + n + " of " + run.steps + " to " + where + "…";
        return call("POST", form.getAttribute("data-runs") + "/" + encode(run.run) + "/steps/" + n)
          .then(function (answer) {
            body.appendChild(stepRow(answer));
            localTimes(body);
            last = answer;
            return step(n + 1);
          });
      }
      return Promise.resolve(step(1)).then(function () {
        result.textContent = "";
        if (!last) { result.textContent = "The scenario has no delivery."; return; }
        result.setAttribute("data-plan", String(last.account.plan));
        result.setAttribute("data-balance", String(last.account.balance));
        result.setAttribute("data-arrival-plan", String(last.on_arrival.plan));
        result.setAttribute("data-arrival-balance", String(last.on_arrival.balance));
        result.appendChild(el("strong", {}, ["Final: " + state(last.account) + "."]));
        result.appendChild(document.createTextNode(" Applying on arrival would hold: " + state(last.on_arrival) + ". "));
        result.appendChild(el("a", {
          href: base + "/console/accounts/" + encode(run.source) + "/" + encode(run.customer)
        }, ["Open the account " + where]));
      });
    }).catch(function (error) {
      result.textContent = "Stopped: " + error.message;
      if (error.status !== 401) { say("Engine Room: " + error.message, "bad"); }
    }).then(function () { button.disabled = false; });
  }

  // --- wiring ----------------------------------------------------------------------------------
  document.addEventListener("submit", function (e) {
    var form = e.target;
    if (form.id === "key-form") {
      e.preventDefault();
      var key = document.getElementById("api-key").value.trim();
      if (!key) { return; }
      setKey(key);
      say("");
      load();
    } else if (form.id === "account-form") {
      e.preventDefault();
      var source = form.elements.source.value.trim();
      var customer = form.elements.customer.value.trim();
      if (!source || !customer) { return; }
      location.assign(base + "/console/accounts/" + encode(source) + "/" + encode(customer));
    } else if (form.getAttribute("data-action") === "POST") {
      e.preventDefault();
      post(form);
    } else if ((form.getAttribute("method") || "").toLowerCase() === "get" &&
               (form.getAttribute("action") || "").indexOf(base + "/console/") === 0) {
      e.preventDefault();
      navigate(form);
    }
  });

  document.addEventListener("click", function (e) {
    var target = e.target;
    if (!(target instanceof Element)) { return; }
    var why = target.closest("a[href^='#why-']");
    if (why) {
      openWhy(why.getAttribute("href"));
      return;
    }
    if (target.id === "forget-key") {
      forgetKey();
      say("The key is forgotten.", "plain");
      showKeyForm();
    } else if (target.id === "run") {
      runEngine(target);
    }
  });

  // The header's link to this section is the current page.
  var section = rest.split("/")[0].split("?")[0];
  Array.prototype.forEach.call(document.querySelectorAll("header nav a[data-section]"), function (a) {
    var of = a.getAttribute("data-section");
    if (of === section) { a.setAttribute("aria-current", "page"); }
  });

  load();
})();
