// Drives the rebound console in Debian's headless Chromium as a person
// uses it, for internal/console's TestBrowser, which starts the console
// and the broker state this script expects, and checks the broker after.
//
// Input (environment): CONSOLE_URL, CONSOLE_USER/CONSOLE_PASSWORD (may
// read and move everything), CONSOLE_OUTSIDER/CONSOLE_OUTSIDER_PASSWORD
// (may not read the parking queue), CONSOLE_GROUP (the group to replay),
// CONSOLE_COUNT (its messages), CONSOLE_LATE (how many the test parks
// into the group between the replay's preview and its confirmation: after
// printing "step: replay previewed" the script waits for a line on stdin
// saying they are parked), CONSOLE_SCREENSHOTS (a directory to save a
// screenshot of each page into; unset: none), CHROMIUM (the browser).
// It prints one line per step and exits 1 at the first that fails.
import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

const env = process.env;
const base = env.CONSOLE_URL;
const group = env.CONSOLE_GROUP;
const shots = env.CONSOLE_SCREENSHOTS || '';
const profile = mkdtempSync(join(tmpdir(), 'rebound-console-chromium-'));

function fail(msg) { throw new Error(msg); }
async function shot(page, name) {
  if (shots) await page.screenshot({ path: join(shots, name + '.png'), fullPage: true });
}
async function text(page) { return page.locator('main').innerText(); }

// A fresh profile (--user-data-dir, which playwright passes for a
// persistent context) each run.
const context = await chromium.launchPersistentContext(profile, {
  executablePath: env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1280, height: 800 },
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
let code = 0;
try {
  context.setDefaultTimeout(60000);
  const page = await context.newPage();

  await page.goto(base + '/groups');
  if (!page.url().endsWith('/signin')) fail('a page without a session did not send to sign-in: ' + page.url());
  await shot(page, 'signin');
  console.log('step: sent to sign in');

  await page.fill('#signin-user', env.CONSOLE_USER);
  await page.fill('#signin-password', env.CONSOLE_PASSWORD);
  await Promise.all([page.waitForURL('**/groups'), page.click('#signin-submit')]);
  if (!(await text(page)).includes(group)) fail('the groups page does not list group ' + group);
  await shot(page, 'groups');
  console.log('step: signed in, groups listed');

  await Promise.all([page.waitForURL('**/groups/' + group), page.click('a.group[href="/groups/' + group + '"]')]);
  const count = await page.locator('#count').innerText();
  if (count.trim() !== env.CONSOLE_COUNT) fail('the group page counts ' + count + ', want ' + env.CONSOLE_COUNT);
  await shot(page, 'group');
  console.log('step: group opened, ' + count + ' messages');

  await Promise.all([page.waitForURL('**/messages/*'), page.locator('#messages a').first().click()]);
  if (!(await text(page)).includes('x-retry-parked-reason')) fail('the message page lacks its headers');
  await shot(page, 'message');
  console.log('step: message opened');

  await page.goto(base + '/groups/' + group);
  await Promise.all([page.waitForURL('**/replay*'), page.click('#replay')]);
  const would = await page.locator('#preview-count').innerText();
  if (would.trim() !== env.CONSOLE_COUNT) fail('the replay preview counts ' + would + ', want ' + env.CONSOLE_COUNT);
  await shot(page, 'replay-preview');
  console.log('step: replay previewed, ' + would + ' messages');
  const late = env.CONSOLE_LATE || '0';
  if (late !== '0') {
    await createInterface({ input: process.stdin })[Symbol.asyncIterator]().next();
    console.log('step: ' + late + ' more parked into the group');
  }

  await Promise.all([page.waitForURL('**/jobs/*'), page.click('#confirm')]);
  await page.waitForFunction(() => !document.querySelector('meta[http-equiv="refresh"]') &&
    document.querySelector('#job-state') && !document.querySelector('#job-state').innerText.startsWith('Running'),
    null, { timeout: 60000, polling: 250 });
  const state = await page.locator('#job-state').innerText();
  if (state.trim() !== 'Done.') fail('the replay ended: ' + state);
  await shot(page, 'replay-done');
  console.log('step: replay done: ' + (await page.locator('#job-lines').innerText()).replace(/\n/g, '; '));

  if (late === '0') {
    await page.goto(base + '/groups');
    if ((await text(page)).includes(group)) fail('the replayed group is still listed');
    console.log('step: group gone from the groups page');
  } else {
    await page.goto(base + '/groups/' + group);
    const left = await page.locator('#count').innerText();
    if (left.trim() !== late) fail('the group counts ' + left + ' after the replay, want the ' + late + ' parked after its preview');
    console.log('step: the ' + late + ' parked after the preview still parked');
  }

  await page.goto(base + '/delayed');
  await page.locator('#origins, #empty').first().waitFor();
  await shot(page, 'delayed');
  console.log('step: delayed copies shown');

  await Promise.all([page.waitForURL('**/signin'), page.click('form.signout button')]);
  await page.fill('#signin-user', env.CONSOLE_OUTSIDER);
  await page.fill('#signin-password', env.CONSOLE_OUTSIDER_PASSWORD);
  await Promise.all([page.waitForURL('**/groups'), page.click('#signin-submit')]);
  const refused = await text(page);
  if (!refused.includes('refused your user')) fail('a user without read on the parking queue was not refused: ' + refused);
  await shot(page, 'refused');
  console.log('step: a user without permission refused');
} catch (e) {
  console.log('FAIL: ' + e.message);
  code = 1;
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
process.exit(code);
