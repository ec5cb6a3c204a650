// ESLint flat config: the chat page's ES modules (app/web/static/js) and their node tests (tests/js).
// The vendored UMD files (app/web/static/vendor) are not ours and are not linted.
import js from "@eslint/js";

const browser = Object.fromEntries([
  "window", "document", "location", "navigator", "fetch", "WebSocket", "setTimeout", "clearTimeout",
  "setInterval", "clearInterval", "requestAnimationFrame", "console", "crypto", "CSS", "Intl", "Node",
  "Element", "HTMLElement",
].map((name) => [name, "readonly"]));

const node = Object.fromEntries([
  "console", "process", "globalThis", "setTimeout", "clearTimeout", "Response", "URL",
].map((name) => [name, "readonly"]));

export default [
  { ignores: ["app/web/static/vendor/**", "node_modules/**", ".venv/**"] },
  js.configs.recommended,
  {
    files: ["app/web/static/js/**/*.js"],
    languageOptions: { ecmaVersion: 2022, sourceType: "module", globals: browser },
    rules: {
      "no-unused-vars": ["error", { args: "none" }],
      eqeqeq: ["error", "always"],
      "no-implicit-globals": "error",
      "prefer-const": "error",
    },
  },
  {
    files: ["tests/js/**/*.js", "eslint.config.js"],
    languageOptions: { ecmaVersion: 2022, sourceType: "module", globals: node },
  },
];
