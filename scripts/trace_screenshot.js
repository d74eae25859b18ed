#!/usr/bin/env node
// What docs/trace.png is: a screenshot of a Trace Event JSON file (History.to_perfetto's) in catapult's trace
// viewer, the viewer chrome://tracing is, rendered by a headless Chromium. Not run in CI.
//
//     python -m aiocubie demo --backend simulator --trace demo-trace.json
//     npm install --prefix TOOLS puppeteer-core @sparticuz/chromium   # a Chromium in the npm tarball itself
//     git clone https://github.com/catapult-project/catapult CATAPULT
//     node scripts/trace_screenshot.js TOOLS CATAPULT demo-trace.json docs/trace.png
//
// CATAPULT's tracing/bin/trace2html (python3) writes the viewer and the trace as one page; the page is
// loaded, the time axis set to the trace's span (the viewer pads it by 15% each side) and every track
// photographed, down to the last counter track; the analysis panel below
// the tracks and the floating mouse-mode buttons over them are left out.
'use strict';
const {execFileSync} = require('child_process');
const {createRequire} = require('module');
const fs = require('fs');
const os = require('os');
const path = require('path');

const [tools, catapult, trace, out] = process.argv.slice(2);
if (!tools || !catapult || !trace || !out) {
  console.error('usage: node scripts/trace_screenshot.js TOOLS CATAPULT trace.json out.png');
  process.exit(2);
}
const need = createRequire(path.join(path.resolve(tools), 'package.json'));
const chromium = need('@sparticuz/chromium');
const puppeteer = need('puppeteer-core');
const WIDTH = 1600;

async function main() {
  const html = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'trace-screenshot-')), 'trace.html');
  execFileSync('python3', [path.join(catapult, 'tracing', 'bin', 'trace2html'), trace, '--output', html, '--quiet',
    '--title', path.basename(trace)]);
  const browser = await puppeteer.launch({
    args: chromium.args, executablePath: await chromium.executablePath(), headless: 'shell',
  });
  try {
    const page = await browser.newPage();
    const errors = [];
    page.on('pageerror', error => errors.push(error.message));
    await page.setViewport({width: WIDTH, height: 3000});
    await page.goto(`file://${html}`, {waitUntil: 'load'});
    await page.waitForFunction(() => typeof g_timelineViewEl !== 'undefined' && g_timelineViewEl.model);
    await new Promise(resolve => setTimeout(resolve, 1000));  // the viewer sets its own time axis first
    await page.addStyleTag({content: 'tr-ui-b-mouse-mode-selector { display: none !important; }'});
    const bottom = await page.evaluate(() => {
      /* global g_timelineViewEl */
      const view = g_timelineViewEl.trackView;
      const bounds = g_timelineViewEl.model.bounds;
      const margin = bounds.range * 0.02;
      view.displayTransform_.set(view.viewport.currentDisplayTransform);
      view.displayTransform_.xSetWorldBounds(
          bounds.min - margin, bounds.max + margin, view.modelTrackContainer_.canvas.width);
      view.viewport.setDisplayTransformImmediately(view.displayTransform_);
      const tracks = view.modelTrack_.getBoundingClientRect();
      return Math.ceil(tracks.top + tracks.height);
    });
    await new Promise(resolve => setTimeout(resolve, 1000));  // the canvas redraws on the next frames
    if (errors.length) throw new Error(`the viewer failed: ${errors.join('; ')}`);
    await page.screenshot({path: out, clip: {x: 0, y: 0, width: WIDTH, height: bottom + 4}});
  } finally {
    await browser.close();
  }
}

main().catch(error => {
  console.error(error);
  process.exit(1);
});
