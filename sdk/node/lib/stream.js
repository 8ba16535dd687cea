'use strict';
// ProcessOutputStream, the one bidirectional RPC: one processor's view of a streamed response,
// part by part, with the state carried across the whole stream.

const convert = require('./convert');
const { fillEffects, plainObject, quote, toStatus } = require('./effects');
const { InternalError, InvalidInputError } = require('./errors');
const { HookEffects, Writer } = require('./processor');
const tracing = require('./tracing');

/**
 * Serve one ProcessOutputStream call for `servicer` (lookup, base arguments, hook calls): batches
 * are handled strictly in order; each part gets one result (seq echoed, part absent = drop);
 * after an abort or the client's half-close, StreamEnd{state}. Requests arrive as Buffers;
 * `decodeRequest` decodes one (undecodable: INVALID_ARGUMENT).
 */
function outputStream(servicer, hook, call, decodeRequest) {
  const controller = new AbortController();
  let hosted = null;
  let base = null;
  const streamParts = [];
  let finished = false;
  let halfClosed = false;
  let endSent = false;
  let chain = Promise.resolve();
  // One span for the session (not current: it lives across many callbacks); a no-op until the
  // first request names the processor, and when tracing is off.
  let span = new tracing.Span();

  const fail = (err) => {
    if (finished) return;
    finished = true;
    span.outcome('failure');
    span.end(err);
    call.emit('error', toStatus(err));
  };
  const finish = () => {
    if (finished) return;
    let state;
    try {
      state = convert.toStruct(base ? base.state : undefined);
    } catch (err) {
      throw new InternalError(`processor ${quote(hosted.id)} left a state that cannot be sent: ${err.message}`);
    }
    finished = true;
    call.write({ end: { state } });
    endSent = true;
    span.end();
    // After an abort the call stays open until the client half-closes or cancels: ending it
    // first can fail a write the client has in flight, and grpc clients then report that
    // failure instead of the abort they have not read yet.
    if (halfClosed) call.end();
  };
  const handle = async (buf) => {
    if (finished) return;
    const req = decodeRequest(buf);
    if (hosted === null) {
      hosted = servicer.lookup(req.context, hook);
      base = servicer.baseArgs(hosted, req.context, new HookEffects(hosted.id), controller.signal);
      base.streamParts = streamParts;
      const wire = tracing.wireHook(hook);
      span = tracing.start(`procmesh.hook ${wire} ${hosted.id}`, {
        kind: 'server',
        attributes: { 'procmesh.hook': wire, 'procmesh.processor.id': hosted.id },
        parent: call.metadata,
      });
      span.outcome('pass');
    }
    const results = [];
    let aborted = false;
    for (const item of req.parts || []) {
      const seq = item.seq || 0;
      if (!item.part || !item.part.type) throw new InvalidInputError(`malformed ${hook} request: stream part ${seq} has no chunk type`);
      const result = { seq };
      const part = convert.chunkFromProto(item.part);
      if (part.type.startsWith('data-') && !hosted.processor.processDataParts) {
        result.part = item.part; // passed through untouched
        results.push(result);
        continue;
      }
      streamParts.push(part);
      const effects = new HookEffects(hosted.id);
      const args = {
        ...base,
        part,
        abort: effects.abortHook,
        sendSignal: effects.sendSignal,
        writer: new Writer(effects),
        reportViolation: effects.reportViolation,
      };
      const out = await servicer.callHook(hosted, hook, args, effects);
      if (finished) return; // cancelled meanwhile
      if (!effects.abort && out !== undefined && out !== null) {
        // an array turns one part into several (empty: dropped)
        const parts = Array.isArray(out) ? out : [out];
        parts.forEach((chunk, i) => {
          if (!plainObject(chunk) || typeof chunk.type !== 'string') {
            throw new InternalError(`${hook} returned ${convert.describe(chunk)}; expected a chunk object, an array of them, or nothing`);
          }
          let encoded;
          try {
            encoded = convert.chunkToProto(chunk);
          } catch (err) {
            throw new InternalError(`${hook} returned a malformed chunk: ${err.message}`);
          }
          if (i === 0) result.part = encoded;
          else (result.extra_parts = result.extra_parts || []).push(encoded);
        });
      }
      const fx = fillEffects(effects, undefined);
      if (fx.abort || fx.signals.length || fx.custom_chunks.length || fx.violations.length) result.effects = fx;
      results.push(result);
      if (effects.abort) {
        aborted = true;
        break;
      }
    }
    if (!finished) call.write({ results });
    if (aborted) {
      span.outcome('abort');
      finish();
    }
  };

  call.on('data', (req) => {
    chain = chain.then(() => handle(req)).catch(fail);
  });
  call.on('end', () => {
    halfClosed = true;
    chain = chain.then(() => (endSent ? call.end() : finish())).catch(fail);
  });
  call.on('cancelled', () => {
    finished = true;
    span.end();
    controller.abort(new Error('the call was cancelled'));
  });
  call.on('error', () => {}); // the status is sent by grpc-js; nothing else to do
}

module.exports = { outputStream };
