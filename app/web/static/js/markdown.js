// @ts-check
/**
 * Assistant text as markdown, safely: marked renders it, DOMPurify sanitizes it (raw HTML in the markdown is
 * shown as text, images become links). Both are vendored UMD files (vendor/marked.umd.js,
 * vendor/purify.min.js) loaded by classic `<script defer>` tags before this module runs; they expose the
 * globals window.marked and window.DOMPurify. Without them, text is shown as plain text.
 */
import { escapeHtml } from "./format.js";

/** @type {any} */
const w = window;
const marked = w.marked;
const purify = w.DOMPurify;

const hasMarkdown = typeof marked !== "undefined" && typeof purify !== "undefined" &&
  typeof purify.sanitize === "function" && purify.isSupported !== false;

const PURIFY_CONFIG = {
  USE_PROFILES: { html: true },
  FORBID_TAGS: ["style", "img", "svg", "math", "form", "input", "button", "textarea", "select", "option",
    "iframe", "frame", "object", "embed", "video", "audio", "source", "picture", "link", "meta", "base", "template"],
  FORBID_ATTR: ["style", "id", "name", "srcset", "action", "formaction"],
  ALLOW_DATA_ATTR: false,
  SANITIZE_NAMED_PROPS: true,
  RETURN_DOM_FRAGMENT: true,
};

if (hasMarkdown) {
  marked.use({
    gfm: true,
    breaks: true,
    async: false,
    renderer: {
      /** Raw HTML in a message is shown as text, never interpreted. @param {{text?: string, raw?: string, block?: boolean}} token */
      html(token) {
        const text = escapeHtml(token.text || token.raw || "");
        return token.block ? `<p>${text.replace(/\n+$/, "").replace(/\n/g, "<br>")}</p>\n` : text;
      },
      /** Images are not loaded (no tracking pixels, no exfiltration): they become plain links. @param {{text?: string, href?: string}} token */
      image(token) {
        const label = "image: " + (token.text || token.href || "");
        return `<a href="${escapeHtml(token.href || "")}">${escapeHtml(label)}</a>`;
      },
    },
  });
  purify.addHook("afterSanitizeAttributes", (/** @type {Element} */ node) => {
    if (node.nodeName === "A") {
      if (node.hasAttribute("href")) {
        node.setAttribute("target", "_blank");
        node.setAttribute("rel", "noopener noreferrer");
      } else {
        node.removeAttribute("target");
      }
    }
  });
}

/**
 * Render assistant markdown into node, safely.
 * @param {HTMLElement} node
 * @param {string} text
 */
export function renderMarkdown(node, text) {
  if (!hasMarkdown) { // vendor scripts missing: plain text is always safe
    node.textContent = text;
    return;
  }
  try {
    const html = marked.parse(text);
    node.replaceChildren(purify.sanitize(html, PURIFY_CONFIG));
  } catch {
    node.textContent = text;
  }
}
