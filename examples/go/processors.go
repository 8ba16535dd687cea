package main

import (
	"strings"

	"google.golang.org/protobuf/types/known/structpb"

	pb "procmesh.example/gen/procmeshv1"
)

func hosted() []processor {
	return []processor{wordGuard{}, shout{}}
}

// wordGuard blocks the run when the new input contains one of its `words` (default: none).
type wordGuard struct{}

type guardOptions struct{ words []string }

func (wordGuard) info() *pb.ProcessorInfo {
	return &pb.ProcessorInfo{
		Id:          "word-guard",
		Name:        "word-guard",
		Description: "Aborts the run when the new input contains a blocked word.",
		Hooks:       []pb.Hook{pb.Hook_HOOK_PROCESS_INPUT},
		OptionsSchemaJson: `{"type": "object", "additionalProperties": false,
  "properties": {"words": {"type": "array", "items": {"type": "string"}, "default": []}}}`,
	}
}

func (wordGuard) parseOptions(options *structpb.Struct) (any, error) {
	if err := onlyKeys(options, "words"); err != nil {
		return nil, err
	}
	words, err := stringList(options, "words")
	return guardOptions{words}, err
}

func (wordGuard) processInput(req *pb.ProcessInputRequest, options any) (*pb.ProcessInputResponse, error) {
	words := options.(guardOptions).words
	for _, m := range req.Messages {
		for _, part := range m.GetContent().GetParts() {
			if word := firstWord(part.GetText().GetText(), words); word != "" {
				// abort("...", {metadata: {word}}): retry stays false, ProcessInput cannot replay.
				// No state in the effects: the stored state is kept as it is.
				return &pb.ProcessInputResponse{Effects: &pb.HookEffects{Abort: &pb.Abort{
					Reason:   "blocked word: " + word,
					Metadata: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"word": structpb.NewStringValue(word)}}),
				}}}, nil
			}
		}
	}
	return &pb.ProcessInputResponse{}, nil // nothing replaced: the replace_* flags stay false
}

// shout upper-cases streamed text, counts the text deltas it saw in its state (`shoutedDeltas`,
// kept across the run's streams), and aborts on a delta containing one of `abortOn`.
type shout struct{}

type shoutOptions struct{ abortOn []string }

func (shout) info() *pb.ProcessorInfo {
	return &pb.ProcessorInfo{
		Id:          "shout",
		Name:        "shout",
		Description: "Upper-cases streamed text; aborts on a word of abortOn.",
		Hooks:       []pb.Hook{pb.Hook_HOOK_PROCESS_OUTPUT_STREAM},
		OptionsSchemaJson: `{"type": "object", "additionalProperties": false,
  "properties": {"abortOn": {"type": "array", "items": {"type": "string"}, "default": []}}}`,
	}
}

func (shout) parseOptions(options *structpb.Struct) (any, error) {
	if err := onlyKeys(options, "abortOn"); err != nil {
		return nil, err
	}
	words, err := stringList(options, "abortOn")
	return shoutOptions{words}, err
}

func (shout) processPart(sp *pb.StreamPart, state *structpb.Struct, options any) *pb.StreamPartResult {
	part := sp.GetPart()
	delta := part.GetTextDelta()
	if part.GetType() != "text-delta" || delta == nil {
		// Every other chunk (tool chunks, data-* parts) passes untouched, in its place.
		return &pb.StreamPartResult{Seq: sp.Seq, Part: part}
	}
	if word := firstWord(delta.Text, options.(shoutOptions).abortOn); word != "" {
		// An abort carries no part: the orchestrator emits nothing after it.
		return &pb.StreamPartResult{Seq: sp.Seq, Effects: &pb.HookEffects{Abort: &pb.Abort{
			Reason: "shout will not say: " + word,
		}}}
	}
	count := state.Fields["shoutedDeltas"].GetNumberValue()
	state.Fields["shoutedDeltas"] = structpb.NewNumberValue(count + 1)
	return &pb.StreamPartResult{Seq: sp.Seq, Part: &pb.Chunk{
		Type:      part.Type,
		Payload:   &pb.Chunk_TextDelta{TextDelta: &pb.TextDelta{Id: delta.Id, Text: strings.ToUpper(delta.Text)}},
		Transient: part.Transient,
	}}
}

// firstWord is the first of `words` (lower case) that `text` contains, ignoring case; "" if none.
func firstWord(text string, words []string) string {
	lower := strings.ToLower(text)
	for _, w := range words {
		if w != "" && strings.Contains(lower, w) {
			return w
		}
	}
	return ""
}
