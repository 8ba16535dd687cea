'use strict';
// ProcessOutputStream, the one bidirectional RPC: the processors' view of a streamed response,
// part by part, with the state carried across the whole stream. A fused stream (context.fused)
// runs each part through every processor it names (./chain); a stream whose processors are all
// speculative keeps what undoes its uncommitted batches (./rewind), so rewind_to can withdraw
// parts; any other stream refuses it (FAILED_PRECONDITION). A hook's `release(parts)` lets held
// parts go while it still processes a part: on a stream whose first request set partial_results
// and that runs one processor, each is sent at once as a partial result (more), behind the
// batch's results so far; otherwise the parts lead the part's one result. On a stream whose
// orchestrator takes them (unchanged_results), a run of text deltas a hook gave back as they
// came, with no effects, is answered by one result (unchanged_through), as in the Python SDK.

const convert = require('./convert');
const { fillEffects, quote, toStatus } = require('./effects');
const { FailedPreconditionError, InternalError, InvalidInputError } = require('./errors');
const { Results, pristine, throughAll, untouched } = require('./chain');
const { HookEffects, Writer } = require('./processor');
const { History } = require('./rewind');
const { outcomeOf } = require('./metrics');
const tracing = require('./tracing');

/** One processor of a stream session: its arguments for the whole stream and what it has seen. */
class Stage {
  constructor(servicer, hosted, ctx, signal, member = null) {
    this.hosted = hosted;
    const session = new HookEffects(hosted.id);
    session.contextUpdates = null; // requestContext.set throws here: a stream part cannot set values
    this.args = servicer.baseArgs(hosted, ctx, session, signal, member);
    this.streamParts = [];
    this.args.streamParts = this.streamParts;
    this.dataParts = Boolean(hosted.processor.processDataParts);
    /** Why its hook failed (a fused stream's further processor then passes parts through). */
    this.error = '';
    /** Its hook aborted (the session's call is counted as its abort). */
    this.aborted = false;
  }

  /** Whether a chunk of this type goes to its hook. */
  takes(kind) {
    return !this.error && (this.dataParts || !kind.startsWith('data-'));
  }
}

/** What a hook returned (or released): a chunk, an array of them, or nothing, as an array. */
function chunksOf(out) {
  if (out === undefined || out === null) return [];
  return Array.isArray(out) ? out : [out];
}

/** The encoded result of what a lone processor's hook returned for one part. */
function encodeReturn(hook, out, result) {
  // an array turns one part into several (empty: dropped)
  const parts = chunksOf(out);
  parts.forEach((chunk, i) => {
    if (!chunk || typeof chunk !== 'object' || Array.isArray(chunk) || typeof chunk.type !== 'string') {
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

/** One ProcessOutputStream call's processors, their hook calls, and its rewind history. */
class Session {
  constructor(servicer, hook, req, signal, send) {
    const ctx = req.context;
    this.servicer = servicer;
    this.hook = hook;
    const first = servicer.lookup(ctx, hook);
    const fused = servicer.lookupFused(ctx, hook);
    /** Sends a response's results now: partial results go out this way (none when null). */
    this.send = req.partial_results && !fused.length ? send : null;
    /** The orchestrator takes a run of unchanged parts as one result. */
    this.unchanged = Boolean(req.unchanged_results);
    /** The batch's results not sent yet (a partial result goes behind them), and the part's seq. */
    this.results = new Results(this.unchanged);
    this.seq = 0;
    /** The seq of the last part a partial result was sent for (its answer is never a run's). */
    this.partialSeq = 0;
    this.stages = [new Stage(servicer, first, ctx, signal), ...fused.map((h, i) => new Stage(servicer, h, ctx, signal, ctx.fused[i]))];
    this.announce = Boolean(ctx.announce_signals);
    this.history = this.stages.every((s) => s.hosted.processor.speculative) ? new History(this.stages) : null;
    this.call = (stage, part, effects, quiet) => {
      stage.streamParts.push(part);
      const kept = [];
      const release = (parts) => {
        const chunks = chunksOf(parts);
        if (effects.abort) return;
        if (this.send === null || quiet || kept.length) kept.push(...chunks);
        else if (chunks.length) this.sendPartial(chunks, effects);
      };
      const args = {
        ...stage.args,
        part,
        abort: effects.abortHook,
        sendSignal: effects.sendSignal,
        writer: new Writer(effects),
        reportViolation: effects.reportViolation,
        release,
      };
      return this.servicer.callHook(stage.hosted, this.hook, args, effects, quiet).then((out) => {
        if (effects.abort && !quiet) stage.aborted = true;
        return kept.length && !effects.abort ? [...kept, ...chunksOf(out)] : out; // let go as if returned first
      });
    };
  }

  /** A partial result for the part being processed: the effects so far, then `chunks`; sent
   * behind the batch's results before it. */
  sendPartial(chunks, effects) {
    const result = { seq: this.seq, more: true };
    encodeReturn(this.hook, chunks, result);
    const fx = fillEffects(effects, undefined);
    if (fx.signals.length || fx.custom_chunks.length || fx.violations.length) result.effects = fx;
    effects.signals.length = 0;
    effects.customChunks.length = 0;
    effects.violations.length = 0;
    this.partialSeq = this.seq;
    this.send([...this.results.take(), result]);
  }

  /** Count the session as one call of each of its processors: `outcome`, or abort for one whose
   * hook aborted, or the hook's error for one whose hook failed (a fused stream went on). */
  count(outcome) {
    const metrics = this.servicer.metrics;
    if (!metrics) return;
    for (const stage of this.stages) {
      let own = outcome;
      if (stage.aborted) own = 'abort';
      else if (stage.error && outcome === 'ok') own = stage.error.split(':')[0].toLowerCase();
      metrics.observeSession(stage.hosted.id, own);
    }
  }

  /** One batch's parts through the processors: [results, whether one aborted]. */
  async batch(items, quiet = false) {
    for (const item of items) {
      if (!item.part || !item.part.type) throw new InvalidInputError(`malformed ${this.hook} request: stream part ${item.seq || 0} has no chunk type`);
    }
    if (this.stages.length > 1) {
      return throughAll(this.stages, items, this.call, { hook: this.hook, announce: this.announce, quiet, unchanged: this.unchanged });
    }
    const stage = this.stages[0];
    const results = this.results;
    results.take();
    for (const item of items) {
      const result = { seq: item.seq || 0 };
      this.seq = result.seq;
      if (!stage.takes(item.part.type)) {
        results.passed(result.seq, item.part); // passed through untouched
        continue;
      }
      const chunk = convert.chunkFromProto(item.part);
      const before = this.unchanged ? pristine(chunk, item.part) : null;
      const effects = new HookEffects(stage.hosted.id);
      const out = await this.call(stage, chunk, effects, quiet);
      const fx = fillEffects(effects, undefined);
      const quietAll = !fx.abort && !fx.signals.length && !fx.custom_chunks.length && !fx.violations.length;
      if (quietAll && this.partialSeq !== result.seq && untouched(out, before)) {
        results.passed(result.seq, item.part);
        continue;
      }
      if (!effects.abort) encodeReturn(this.hook, out, result);
      if (!quietAll) result.effects = fx;
      results.push(result); // behind those a partial result did not send
      if (effects.abort) return [results.take(), true];
    }
    return [results.take(), false];
  }

  /** A request: its rewind, its commit, then its parts. */
  async answer(req) {
    if (req.rewind_to || req.committed_through) {
      if (this.history === null) {
        const field = req.rewind_to ? 'rewind_to' : 'committed_through';
        const not = this.stages.filter((s) => !s.hosted.processor.speculative).map((s) => s.hosted.id);
        throw new FailedPreconditionError(`${field} is only for speculative processors; not speculative: ${JSON.stringify(not)}`);
      }
      if (req.rewind_to) await this.history.rewind(req.rewind_to, (kept) => this.batch(kept, true));
      if (req.committed_through) this.history.commit(req.committed_through);
    }
    const parts = req.parts || [];
    if (this.history !== null) this.history.keep(parts);
    return this.batch(parts);
  }

  /** The StreamEnd: every processor's state (the further ones' in fused_states). */
  end() {
    const [first, ...others] = this.stages;
    const state = (stage) => {
      try {
        return convert.toStruct(stage.args.state);
      } catch (err) {
        throw new InternalError(`processor ${quote(stage.hosted.id)} left a state that cannot be sent: ${err.message}`);
      }
    };
    const end = { state: state(first) };
    if (others.length) end.fused_states = others.map(state);
    return end;
  }
}

/**
 * Serve one ProcessOutputStream call for `servicer` (lookup, base arguments, hook calls): batches
 * are handled strictly in order; each part gets one result (seq echoed, part absent = drop);
 * after an abort or the client's half-close, StreamEnd{state}. Requests arrive as Buffers;
 * `decodeRequest` decodes one (undecodable: INVALID_ARGUMENT).
 */
function outputStream(servicer, hook, call, decodeRequest) {
  const controller = new AbortController();
  let session = null;
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
    if (session) session.count(outcomeOf(err, null));
    call.emit('error', toStatus(err));
  };
  const finish = () => {
    if (finished) return;
    const end = session ? session.end() : { state: convert.toStruct(undefined) };
    finished = true;
    call.write({ end });
    endSent = true;
    span.end();
    if (session) session.count('ok');
    // After an abort the call stays open until the client half-closes or cancels: ending it
    // first can fail a write the client has in flight, and grpc clients then report that
    // failure instead of the abort they have not read yet.
    if (halfClosed) call.end();
  };
  const handle = async (buf) => {
    if (finished) return;
    const req = decodeRequest(buf);
    if (session === null) {
      const send = (results) => {
        if (!finished) call.write({ results });
      };
      session = new Session(servicer, hook, req, controller.signal, send);
      const id = session.stages[0].hosted.id;
      const wire = tracing.wireHook(hook);
      span = tracing.start(`procmesh.hook ${wire} ${id}`, {
        kind: 'server',
        attributes: { 'procmesh.hook': wire, 'procmesh.processor.id': id },
        parent: call.metadata,
      });
      span.outcome('pass');
      for (const stage of session.stages) stage.args.model.span = span; // its parts' gateway calls carry it
    }
    const [results, aborted] = await session.answer(req);
    if (finished) return; // cancelled meanwhile
    call.write({ results });
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
    if (!finished && session) session.count('cancelled');
    finished = true;
    span.end();
    controller.abort(new Error('the call was cancelled'));
  });
  call.on('error', () => {}); // the status is sent by grpc-js; nothing else to do
}

module.exports = { outputStream };
