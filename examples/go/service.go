package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	pb "procmesh.example/gen/procmeshv1"
)

// sdk is what Describe reports in DescribeResponse.sdk.
const sdk = "procmesh-go-example/0.1.0"

// processor is what every hosted processor has; the hooks are the optional interfaces below.
type processor interface {
	info() *pb.ProcessorInfo
	// parseOptions validates RunContext.options. The orchestrator checks options against the
	// published schema at start-up but fills in no defaults: the processor applies its own.
	parseOptions(*structpb.Struct) (any, error)
}

// inputProcessor implements ProcessInput.
type inputProcessor interface {
	processInput(req *pb.ProcessInputRequest, options any) (*pb.ProcessInputResponse, error)
}

// streamProcessor implements ProcessOutputStream: one call per part, in order. The state is the
// stream's, mutated in place; a result whose effects carry an abort ends the stream.
type streamProcessor interface {
	processPart(part *pb.StreamPart, state *structpb.Struct, options any) *pb.StreamPartResult
}

// service serves pb.ProcessorService for the hosted processors. The RPCs it does not define
// answer UNIMPLEMENTED through the embedded generated type.
type service struct {
	pb.UnimplementedProcessorServiceServer
	processors map[string]processor
	order      []string
}

func newService(procs []processor) *service {
	s := &service{processors: map[string]processor{}}
	for _, p := range procs {
		id := p.info().Id
		s.processors[id] = p
		s.order = append(s.order, id)
	}
	return s
}

func (s *service) Describe(context.Context, *pb.DescribeRequest) (*pb.DescribeResponse, error) {
	resp := &pb.DescribeResponse{Sdk: sdk}
	for _, id := range s.order {
		resp.Processors = append(resp.Processors, s.processors[id].info())
	}
	return resp, nil
}

// lookup resolves the processor a request names, in the order the contract's status table
// wants: empty id INVALID_ARGUMENT, unknown id NOT_FOUND, hook not declared UNIMPLEMENTED (also
// for a processor hosted next to one that does declare it), bad options INVALID_ARGUMENT.
func (s *service) lookup(ctx *pb.RunContext, hook pb.Hook) (processor, any, error) {
	id := ctx.GetProcessorId()
	if id == "" {
		return nil, nil, status.Error(codes.InvalidArgument, "request.context.processor_id is required")
	}
	p, ok := s.processors[id]
	if !ok {
		hosted := append([]string(nil), s.order...)
		sort.Strings(hosted)
		return nil, nil, status.Errorf(codes.NotFound, "processor %q is not hosted here (hosted: %v)", clip(id, 64), hosted)
	}
	if !declares(p.info(), hook) {
		return nil, nil, status.Errorf(codes.Unimplemented, "processor %q does not implement %s", id, hook)
	}
	options, err := p.parseOptions(ctx.GetOptions())
	if err != nil {
		return nil, nil, status.Errorf(codes.InvalidArgument, "invalid options for processor %q: %v", id, err)
	}
	return p, options, nil
}

func declares(info *pb.ProcessorInfo, hook pb.Hook) bool {
	for _, h := range info.Hooks {
		if h == hook {
			return true
		}
	}
	return false
}

func (s *service) ProcessInput(_ context.Context, req *pb.ProcessInputRequest) (*pb.ProcessInputResponse, error) {
	p, options, err := s.lookup(req.GetContext(), pb.Hook_HOOK_PROCESS_INPUT)
	if err != nil {
		return nil, err
	}
	// A part of a kind this code does not know (a newer orchestrator's: GetKind() is nil, its
	// bytes are kept as unknown fields) is passed through untouched: word-guard reads text parts
	// only and returns no messages, and a processor that did would return the *pb.Part it got.
	return p.(inputProcessor).processInput(req, options)
}

// ProcessOutputStream follows proto/README.md's stream protocol: the first request names the
// processor and brings the state; every part gets one result, in order, echoing its seq, sent as
// soon as its batch is done (each part's timeout runs from when it was sent); after the client
// half-closes, or right after an abort, one last response carries StreamEnd{state}; the call then
// ends with OK once the client half-closes (or cancels): ending it while the client still writes
// can fail that write, and some clients then lose the abort they have not read yet.
func (s *service) ProcessOutputStream(stream pb.ProcessorService_ProcessOutputStreamServer) error {
	var (
		proc    streamProcessor
		options any
		state   *structpb.Struct
	)
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err // cancelled or past its deadline: gRPC already has the status
		}
		if proc == nil {
			// Only the first message carries the context; one without it names no processor.
			p, opts, err := s.lookup(req.GetContext(), pb.Hook_HOOK_PROCESS_OUTPUT_STREAM)
			if err != nil {
				return err
			}
			proc, options = p.(streamProcessor), opts
			state = copyState(req.GetContext().GetState())
		}
		results := make([]*pb.StreamPartResult, 0, len(req.Parts))
		aborted := false
		for _, part := range req.Parts {
			res := proc.processPart(part, state, options)
			results = append(results, res)
			if res.GetEffects().GetAbort() != nil {
				aborted = true // parts after an abort need no result
				break
			}
		}
		if err := stream.Send(&pb.ProcessOutputStreamResponse{Results: results}); err != nil {
			return err
		}
		if aborted {
			break
		}
	}
	if proc == nil {
		// Half-closed before any message: no processor named, no state to report. Ending without
		// StreamEnd leaves the stored state as it is.
		return nil
	}
	if err := stream.Send(&pb.ProcessOutputStreamResponse{End: &pb.StreamEnd{State: state}}); err != nil {
		return err
	}
	for { // after an abort: drain until the half-close (io.EOF) or the cancel (an error)
		if _, err := stream.Recv(); err != nil {
			return nil
		}
	}
}

// copyState is the state the run sent, or an empty one: the processor returns it whole.
func copyState(sent *structpb.Struct) *structpb.Struct {
	state := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for k, v := range sent.GetFields() {
		state.Fields[k] = v
	}
	return state
}

// clip keeps status details short (both SDKs cut echoed ids to 64 characters).
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// stringList reads an option that must be a list of strings.
func stringList(options *structpb.Struct, key string) ([]string, error) {
	v, ok := options.GetFields()[key]
	if !ok {
		return nil, nil
	}
	list := v.GetListValue()
	if list == nil {
		return nil, fmt.Errorf("%s must be a list of strings", key)
	}
	out := make([]string, 0, len(list.Values))
	for _, item := range list.Values {
		str, ok := item.GetKind().(*structpb.Value_StringValue)
		if !ok {
			return nil, fmt.Errorf("%s must be a list of strings", key)
		}
		out = append(out, strings.ToLower(str.StringValue))
	}
	return out, nil
}

// onlyKeys refuses option keys the processor does not know (its schema's additionalProperties: false).
func onlyKeys(options *structpb.Struct, known ...string) error {
	var unknown []string
	for k := range options.GetFields() {
		found := false
		for _, want := range known {
			found = found || k == want
		}
		if !found {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return fmt.Errorf("unknown keys %q", unknown)
	}
	return nil
}
