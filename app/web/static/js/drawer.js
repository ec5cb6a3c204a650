// @ts-check
/** The memory panel as a drawer on narrow screens, and opening it at a section. */
import { el, narrow } from "./dom.js";

/**
 * Open or close the drawer.
 * @param {boolean} open
 */
export function setDrawer(open) {
  el.panel.classList.toggle("open", open);
  el.backdrop.hidden = !open;
  el.memoryToggle.setAttribute("aria-expanded", String(open));
  if (narrow.matches) {
    if (open) {
      el.panel.setAttribute("role", "dialog");
      el.panel.setAttribute("aria-modal", "true");
      el.drawerClose.focus();
    } else {
      el.panel.removeAttribute("role");
      el.panel.removeAttribute("aria-modal");
    }
  }
}

/** After the layout changed: on wide screens the panel is always shown, never a dialog. */
export function syncDrawerMode() {
  if (!narrow.matches) {
    el.panel.classList.remove("open");
    el.panel.removeAttribute("role");
    el.panel.removeAttribute("aria-modal");
    el.panel.removeAttribute("inert");
    el.backdrop.hidden = true;
    el.memoryToggle.setAttribute("aria-expanded", "true");
  } else {
    el.memoryToggle.setAttribute("aria-expanded", String(el.panel.classList.contains("open")));
  }
}

/**
 * Show the memory panel (the drawer on narrow screens) and bring `section` into view.
 * @param {HTMLElement} [section]
 */
export function openMemory(section) {
  if (narrow.matches) setDrawer(true);
  if (section) {
    section.scrollIntoView({ block: "start", behavior: "smooth" });
    section.classList.remove("flash");
    void section.offsetWidth; // restart the highlight
    section.classList.add("flash");
  }
}

/** Wire the toggle, the close button, the backdrop and Escape. */
export function wireDrawer() {
  el.memoryToggle.addEventListener("click", () => {
    if (!narrow.matches) { el.panel.scrollIntoView({ block: "nearest" }); return; }
    setDrawer(!el.panel.classList.contains("open"));
  });
  el.drawerClose.addEventListener("click", () => { setDrawer(false); el.memoryToggle.focus(); });
  el.backdrop.addEventListener("click", () => setDrawer(false));
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && narrow.matches && el.panel.classList.contains("open")) {
      setDrawer(false);
      el.memoryToggle.focus();
    }
  });
  if (narrow.addEventListener) narrow.addEventListener("change", syncDrawerMode);
  el.memoryHint.addEventListener("click", () => { if (narrow.matches) setDrawer(true); });
}
