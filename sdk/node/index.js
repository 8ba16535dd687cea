'use strict';
// @procmesh/sdk: write Mastra-style processors in JavaScript/TypeScript and serve them as
// procmesh gRPC sidecars. A processor is any object with a string `id` and camelCase hooks
// (processInput, processOutputStream, ...); `serve([processors], { address })` hosts them.

const convert = require('./lib/convert');
const { SERVICE_NAME, loadContract, protoDir } = require('./lib/contract');
// the gateway's error beside the SDK's own, so a hook can catch it (./lib/model)
const errors = { ...require('./lib/errors'), ModelError: require('./lib/model').ModelError };
const hooks = require('./lib/hooks');
const { HOOK_NAMES } = hooks;
const { MessageList, Processor, RequestContext, TripWire, Writer } = require('./lib/processor');
const { ProcessorServer, run, serve, settingsFromArgs } = require('./lib/server');
const { ToolWriter } = require('./lib/tools');
const { version } = require('./package.json');

module.exports = {
  HOOK_NAMES,
  MessageList,
  Processor,
  ProcessorServer,
  RequestContext,
  SERVICE_NAME,
  ToolWriter,
  TripWire,
  Writer,
  convert,
  errors,
  hooks,
  loadContract,
  protoDir,
  run,
  serve,
  settingsFromArgs,
  version,
};
