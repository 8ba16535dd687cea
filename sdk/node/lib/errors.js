'use strict';
// The error tree and its one mapping to gRPC status codes (the twin of procmesh.errors).
// The server ends a call with the code of the error it caught; anything else a hook throws
// becomes INTERNAL.

const { status } = require('@grpc/grpc-js');

class ProcmeshError extends Error {
  constructor(message) {
    super(message);
    this.name = new.target.name;
  }
}
ProcmeshError.prototype.code = status.UNKNOWN;

function define(name, code) {
  const cls = { [name]: class extends ProcmeshError {} }[name];
  cls.prototype.code = code;
  return cls;
}

/** A request or a hook's use of the SDK is malformed (INVALID_ARGUMENT). */
const InvalidInputError = define('InvalidInputError', status.INVALID_ARGUMENT);
/** The request names a processor the server does not host (NOT_FOUND). */
const NotFoundError = define('NotFoundError', status.NOT_FOUND);
/** The processor does not implement the called hook (UNIMPLEMENTED). */
const UnimplementedError = define('UnimplementedError', status.UNIMPLEMENTED);
/**
 * The server is starting or draining (UNAVAILABLE): the code gRPC clients retry and load
 * balancing steers around, so the call goes to a replica that is ready.
 */
const NotReadyError = define('NotReadyError', status.UNAVAILABLE);
/**
 * The request asks for what this processor did not declare, e.g. a rewind of one that is not
 * speculative (FAILED_PRECONDITION): resending it will not help.
 */
const FailedPreconditionError = define('FailedPreconditionError', status.FAILED_PRECONDITION);
/** The hook threw, or returned a value of the wrong shape (INTERNAL). */
const InternalError = define('InternalError', status.INTERNAL);

module.exports = { FailedPreconditionError, InternalError, InvalidInputError, NotFoundError, NotReadyError, ProcmeshError, UnimplementedError };
