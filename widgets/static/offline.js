// A minillm view without a kernel (widgets/offline.py): the controls of the precomputed states,
// and the picture of the state they select. The pictures are Python's own (to_svg), stored as
// lists of indices into their distinct SVG elements, gzipped and base64-encoded; frame n is the
// n-th combination of the controls' values, the last control varying fastest (the order of
// Python's itertools.product). Without DecompressionStream the page keeps the static picture.
(function () {
  "use strict";

  async function unpack(text) {
    const bytes = Uint8Array.from(atob(text.trim()), (c) => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return JSON.parse(await new Response(stream).text());
  }

  async function init(box) {
    if (box.dataset.ready || typeof DecompressionStream === "undefined") return;
    box.dataset.ready = "loading";
    const data = await unpack(box.querySelector("script.mv-data").textContent);
    const picture = box.querySelector(".mv-picture");
    const controls = data.controls;
    const at = controls.map(() => 0); // the index of each control's value
    let rest = data.initial;
    for (let k = controls.length - 1; k >= 0; k--) {
      at[k] = rest % controls[k].values.length;
      rest = Math.floor(rest / controls[k].values.length);
    }
    const refreshers = [];

    function frameNumber() {
      return at.reduce((n, i, k) => n * controls[k].values.length + i, 0);
    }

    function show() {
      const n = frameNumber();
      const svg = data.frames[n].map((i) => data.pieces[i]).join("");
      picture.innerHTML = svg;
      box.mvSource = svg; // exactly what Python drew, for the tests
      box.dataset.frame = String(n);
      refreshers.forEach((refresh) => refresh());
    }

    function labelOf(control, value) {
      const pair = (control.options || []).find((p) => p[1] === value);
      return pair ? pair[0] : String(value);
    }

    const bar = document.createElement("div");
    bar.className = "mv-controls";
    bar.style.cssText = "display:flex;flex-wrap:wrap;gap:4px 16px;align-items:center;" +
      "font:12px sans-serif;margin:4px 0";
    controls.forEach((control, k) => {
      const label = document.createElement("label");
      label.style.cssText = "display:flex;gap:6px;align-items:center";
      const name = document.createElement("span");
      label.appendChild(name);
      let input;
      if (control.kind === "range") {
        input = document.createElement("input");
        input.type = "range";
        input.min = "0";
        input.max = String(control.values.length - 1);
        input.step = "1";
        input.value = String(at[k]);
        input.addEventListener("input", () => { at[k] = Number(input.value); show(); });
        refreshers.push(() => {
          input.value = String(at[k]);
          name.textContent = control.label + " " + labelOf(control, control.values[at[k]]);
        });
      } else {
        input = document.createElement("select");
        control.values.forEach((value, i) => {
          const option = document.createElement("option");
          option.value = String(i);
          option.textContent = labelOf(control, value);
          input.appendChild(option);
        });
        input.value = String(at[k]);
        input.addEventListener("change", () => { at[k] = Number(input.value); show(); });
        refreshers.push(() => { input.value = String(at[k]); name.textContent = control.label; });
      }
      input.dataset.control = control.name;
      label.appendChild(input);
      if (control.play) {
        const play = document.createElement("button");
        play.type = "button";
        play.textContent = "\u25B6";
        play.title = "replay the steps";
        let timer = null;
        play.addEventListener("click", () => {
          if (timer) { clearInterval(timer); timer = null; return; }
          if (at[k] === control.values.length - 1) at[k] = 0;
          timer = setInterval(() => {
            if (at[k] >= control.values.length - 1) { clearInterval(timer); timer = null; return; }
            at[k] += 1;
            show();
          }, 250);
          show();
        });
        label.appendChild(play);
      }
      bar.appendChild(label);
    });
    const note = document.createElement("span");
    note.style.cssText = "color:#666";
    note.textContent = data.frames.length + " states precomputed: run the notebook for every value";
    bar.appendChild(note);
    box.insertBefore(bar, picture.nextSibling);
    refreshers.forEach((refresh) => refresh());
    box.mvSource = data.frames[frameNumber()].map((i) => data.pieces[i]).join("");
    box.dataset.frame = String(frameNumber());
    box.dataset.ready = "1";
  }

  const script = document.currentScript;
  const own = script && script.closest ? script.closest(".minillm-view") : null;
  if (own) init(own);
  else document.querySelectorAll(".minillm-view").forEach((box) => {
    if (box.querySelector("script.mv-data")) init(box);
  });
})();
