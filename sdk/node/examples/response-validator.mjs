// An output-step validator (the seeds' ResponseValidator / QualityChecker): a step whose text is
// too long is rejected with `abort(reason, { retry: true })`, so the model answers again with the
// reason as feedback. Once the retries are used up the answer is let through with a violation.
import { Processor } from '@procmesh/sdk';

export class ResponseValidator extends Processor {
  id = 'response-validator';
  description = 'Asks for a shorter answer (retry with feedback) when a step is too long.';
  optionsSchema = {
    type: 'object',
    additionalProperties: false,
    properties: {
      maxWords: { type: 'integer', minimum: 1, default: 12 },
      maxRetries: { type: 'integer', minimum: 0, default: 2 },
    },
  };

  async processOutputStep({ text, retryCount, options, abort, reportViolation }) {
    const words = text.split(/\s+/).filter(Boolean).length;
    if (words <= options.maxWords) return [];
    if (retryCount < options.maxRetries) {
      abort(`Answer in at most ${options.maxWords} words.`, {
        retry: true,
        metadata: { words, limit: options.maxWords },
      });
    }
    reportViolation(`answer still has ${words} words after ${retryCount} retries`, { words, limit: options.maxWords });
    return [];
  }
}
