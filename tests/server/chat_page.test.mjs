// The chat page in headless Chromium: pick the model, type a message, see the answer stream in,
// and stop a long answer with the stop button.
//
// QUENCH_ROOT: the server's root URL. CHROMIUM: the browser (default /usr/bin/chromium).
import { test } from "node:test";
import assert from "node:assert/strict";
import { chromium } from "playwright-core";

const root = process.env.QUENCH_ROOT;
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";

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

    // Record how the answer grows: more than one distinct length means it streamed.
    await page.fill("#input", "Hello! Tell me about the sea.");
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
    assert.ok(lengths.filter((n) => n > 0).length >= 2, `answer did not stream: ${lengths}`);
    await page.waitForSelector(".msg.meta");
    assert.ok(!(await page.isDisabled("#send")));

    // A second message in the same conversation, stopped at once.
    await page.fill("#input", "Now write a very long poem.");
    await page.click("#send");
    await page.waitForFunction(() => !document.querySelector("#stop").disabled);
    await page.click("#stop");
    await page.waitForFunction(() => document.querySelectorAll(".msg.assistant").length === 2 &&
      document.querySelectorAll(".msg.assistant")[1].dataset.state === "done");
    assert.ok(await page.isDisabled("#stop"));

    // Everything the page loaded came from the server itself.
    assert.ok(requests.every((u) => u.startsWith(root)), requests.join(" "));
  } finally {
    await browser.close();
  }
});
