// The chat page in headless Chromium: pick the model, type a message, see the answer stream in,
// and stop a long answer with the stop button.
//
// QUENCH_ROOT: the server's root URL. CHROMIUM: the browser (default /usr/bin/chromium).
import { test } from "node:test";
import assert from "node:assert/strict";
import { chromium } from "playwright-core";

const root = process.env.QUENCH_ROOT;
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
// A real model on two cores answers a long prompt in tens of seconds.
const WAIT_MS = 180000;

test("chat page streams an answer and stops on request", async () => {
  assert.ok(root, "QUENCH_ROOT is not set: run tests/server/run.sh");
  const browser = await chromium.launch({
    executablePath,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run"],
  });
  try {
    const page = await browser.newPage();
    const requests = [];
    page.on("request", (r) => requests.push(r.url()));
    await page.goto(root + "/");
    await page.waitForFunction(() => document.querySelectorAll("#model option").length > 0);
    const model = await page.inputValue("#model");
    assert.equal(model, process.env.QUENCH_CHAT_MODEL);

    // Greedy, and a network slow enough that a fast model's answer still arrives over a
    // second or so. Record how the answer grows: several lengths mean it streamed.
    await page.fill("#temperature", "0");
    await page.fill("#max-tokens", "64");
    const cdp = await page.context().newCDPSession(page);
    await cdp.send("Network.enable");
    const throttle = (bytesPerSecond) => cdp.send("Network.emulateNetworkConditions", {
      offline: false, latency: 0, downloadThroughput: bytesPerSecond, uploadThroughput: -1,
    });
    await throttle(20000);
    await page.fill("#input", "Write a poem about the sea.");
    await page.keyboard.press("Enter");
    await page.waitForSelector(".msg.user");
    const lengths = await page.evaluate(() => new Promise((resolve) => {
      const seen = [];
      const timer = setInterval(() => {
        const out = document.querySelector(".msg.assistant");
        if (!out) return;
        const n = out.textContent.length;
        if (seen[seen.length - 1] !== n) seen.push(n);
        if (out.dataset.state === "done") { clearInterval(timer); resolve(seen); }
      }, 5);
    }));
    const answer = await page.textContent(".msg.assistant");
    assert.ok(answer.length > 0, "no answer shown");
    assert.ok(lengths.filter((n) => n > 0).length >= 3, `answer did not stream: ${lengths}`);
    await page.waitForSelector(".msg.meta", { timeout: WAIT_MS });
    assert.ok(!(await page.isDisabled("#send")));

    // A second message in the same conversation, stopped while it streams in (over a slow
    // network, so that even a one-token answer is still arriving when the stop is clicked).
    await throttle(2000);
    await page.fill("#input", "Describe the ocean.");
    await page.click("#send");
    await page.waitForFunction(
      () => document.querySelectorAll(".msg.assistant").length === 2 &&
        !document.querySelector("#stop").disabled, null, { timeout: WAIT_MS });
    await page.click("#stop");
    await page.waitForFunction(
      () => document.querySelectorAll(".msg.assistant")[1].dataset.state === "done", null, { timeout: WAIT_MS });
    const metas = await page.$$eval(".msg.meta", (els) => els.map((e) => e.textContent));
    assert.equal(metas[metas.length - 1], "stopped");
    assert.ok(await page.isDisabled("#stop"));
    await throttle(-1);

    // Everything the page loaded came from the server itself.
    assert.ok(requests.every((u) => u.startsWith(root)), requests.join(" "));
  } finally {
    await browser.close();
  }
});
