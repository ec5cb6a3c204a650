// @ts-check
/** The model banner: GET /healthz (docs/contract.md: HTTP) shows it while it says "model": "down". */
import { api } from "./api.js";
import { API } from "./config.js";
import { el } from "./dom.js";
import { health } from "./state.js";
import { HEALTH_MS } from "./backoff.js";

/** Check now, then again in 30 s, or in 5 s while down or soon after a failed turn. */
export async function checkModel() {
  clearTimeout(health.timer);
  const r = await api("GET", API.health);
  const down = Boolean(r.data && typeof r.data === "object" && r.data.model === "down");
  el.modelBanner.hidden = !down;
  const soon = down || health.checksSoon-- > 0; // after a failed turn the server may not know yet
  health.timer = window.setTimeout(checkModel, soon ? HEALTH_MS.down : HEALTH_MS.up);
}

/** A turn failed because of the model: check at the short interval for a while (6 checks). */
export function checkModelSoon() {
  health.checksSoon = 6;
  checkModel();
}
