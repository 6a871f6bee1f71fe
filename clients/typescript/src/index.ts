/** billing-inbox for TypeScript: the app API, effects verified and applied, checks that degrade safely. */
export * from "./client.js";
export * from "./errors.js";
export * from "./retry.js";
export * from "./webhooks.js";
export * from "./receiver.js";
export * from "./checks.js";
export type { components, paths, webhooks } from "./generated/schema.js";
