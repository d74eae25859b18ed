#!/usr/bin/env node
// Import a Trace Event JSON file (History.to_perfetto's) with catapult's trace viewer model, the importer
// chrome://tracing runs, in node; print its import warnings, threads, slice names and counter count as JSON.
//
//     node scripts/catapult_import.js CATAPULT_CHECKOUT trace.json
//
// CATAPULT_CHECKOUT: a checkout of github.com/catapult-project/catapult (catapult_build/, tracing/,
// third_party/vinn/, third_party/polymer/ are what it reads; no network, no browser).
'use strict';
const fs = require('fs');
const path = require('path');

const [catapult, trace] = process.argv.slice(2);
if (!catapult || !trace) {
  console.error('usage: node scripts/catapult_import.js CATAPULT_CHECKOUT trace.json');
  process.exit(2);
}
require(path.join(path.resolve(catapult), 'catapult_build', 'node_bootstrap.js'));  // sets HTMLImportsLoader up
const third = path.join(catapult, 'tracing', 'third_party');
HTMLImportsLoader.addArrayToSourcePath([  // tracing/tracing_project.py's source paths
  path.join(catapult, 'tracing'), path.join(catapult, 'third_party', 'polymer'), third,
  path.join(catapult, 'tracing', 'tracing', 'mre'), ...['jszip', 'pako', 'jpeg-js', 'mannwhitneyu', 'd3', 'chai',
    'mocha', 'oboe'].map(name => path.join(third, name)), path.join(third, 'gl-matrix', 'dist'),
]);
HTMLImportsLoader.loadHTML('/tracing/importer/import.html');
HTMLImportsLoader.loadHTML('/tracing/extras/importer/trace_event_importer.html');
const model = new tr.Model();
new tr.importer.Import(model, new tr.importer.ImportOptions()).importTraces([fs.readFileSync(trace, 'utf8')]);
const threads = [];
const slices = {};
let counters = 0;
for (const proc of Object.values(model.processes)) {
  counters += Object.keys(proc.counters).length;
  for (const thread of Object.values(proc.threads)) {
    threads.push(`${proc.name}/${thread.name}`);
    for (const slice of thread.sliceGroup.slices) slices[slice.title] = (slices[slice.title] || 0) + 1;
  }
}
console.log(JSON.stringify({
  warnings: model.importWarnings.map(w => `${w.type}: ${w.message}`), threads: threads.sort(), slices, counters,
}));
