// Command go-sidecar is a procmesh processor sidecar written from proto/ alone: no
// procmesh SDK, only the stubs protoc generates from proto/procmesh/v1 and the standard gRPC
// health and reflection services. It hosts two processors (processors.go):
//
//   - word-guard (ProcessInput): aborts the run when the new input contains a blocked word;
//   - shout (ProcessOutputStream): upper-cases streamed text and counts the deltas in its state,
//     and aborts the stream on a word of its `abortOn` option.
//
// Usage: go-sidecar [--listen ADDR] [--grace-seconds S]. ADDR is host:port (port 0 picks
// one) or unix:///path.sock; the default is $PROCMESH_LISTEN, else 127.0.0.1:50051. S defaults to
// $PROCMESH_GRACE_SECONDS, else 10. Any other PROCMESH_* variable is checked as the SDKs check it
// (environment.go): another component's is logged and not read, a name no component reads is an
// error at start (exit status 2).
package main

import (
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	pb "procmesh.example/gen/procmeshv1"
)

// serviceName is the health service name the orchestrator, the probes and the checker ask about.
const serviceName = "procmesh.v1.ProcessorService"

// maxMessage matches the orchestrator's limit (proto/README.md): 16 MiB each way.
const maxMessage = 16 << 20

func main() {
	// A misspelt variable must not leave the sidecar on the default it was meant to change.
	env := checkEnvironment(os.Environ())
	if msg := env.error(); msg != "" {
		fmt.Fprintf(os.Stderr, "go-sidecar: error: %s\n", msg)
		os.Exit(2)
	}
	defaultListen := os.Getenv("PROCMESH_LISTEN")
	if defaultListen == "" {
		defaultListen = "127.0.0.1:50051"
	}
	defaultGrace := 10.0
	if value, ok := os.LookupEnv("PROCMESH_GRACE_SECONDS"); ok {
		parsed, err := strconv.ParseFloat(value, 64)
		if err != nil || parsed < 0 {
			fmt.Fprintf(os.Stderr, "go-sidecar: error: PROCMESH_GRACE_SECONDS=%q is not a number of seconds\n", value)
			os.Exit(2)
		}
		defaultGrace = parsed
	}
	listen := flag.String("listen", defaultListen, "host:port or unix:///path.sock (env PROCMESH_LISTEN)")
	grace := flag.Float64("grace-seconds", defaultGrace,
		"how long in-flight calls may run on shutdown (env PROCMESH_GRACE_SECONDS)")
	flag.Parse()
	if flag.NArg() > 0 {
		// A stray word is a typo, not something to ignore (the flag package stops at the first one).
		fmt.Fprintf(os.Stderr, "go-sidecar: unexpected argument %q\n", flag.Arg(0))
		os.Exit(2)
	}
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetPrefix("go-sidecar ")
	if note := env.note(); note != "" {
		log.Print(note)
	}

	lis, cleanup, err := listenOn(*listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "go-sidecar: cannot listen on %s: %v\n", *listen, err)
		os.Exit(2)
	}
	defer cleanup()

	server := grpc.NewServer(grpc.MaxRecvMsgSize(maxMessage), grpc.MaxSendMsgSize(maxMessage))
	pb.RegisterProcessorServiceServer(server, newService(hosted()))
	// NOT_SERVING until everything is registered; a processor with real setup (a model to load)
	// would flip these only after that setup returned.
	healthServer := health.NewServer()
	healthServer.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthServer.SetServingStatus(serviceName, healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(server, healthServer)
	reflection.Register(server)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	served := make(chan error, 1)
	go func() { served <- server.Serve(lis) }()
	healthServer.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthServer.SetServingStatus(serviceName, healthpb.HealthCheckResponse_SERVING)
	log.Printf("serving on %s", describeAddr(*listen, lis))

	select {
	case err := <-served:
		log.Printf("server stopped: %v", err)
		os.Exit(1)
	case sig := <-stop:
		log.Printf("%s: draining (grace %gs)", sig, *grace)
	}
	// Drain: report NOT_SERVING first (the orchestrator and the probes stop sending), let in-flight
	// calls finish within the grace period, then cut what is left.
	healthServer.Shutdown()
	done := make(chan struct{})
	go func() { server.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Duration(*grace * float64(time.Second))):
		server.Stop()
	}
	log.Printf("stopped")
}

// listenOn opens host:port or unix:///path (replacing a stale socket); cleanup removes the socket.
func listenOn(addr string) (net.Listener, func(), error) {
	if strings.HasPrefix(addr, "unix:") {
		path := strings.TrimPrefix(strings.TrimPrefix(addr, "unix:"), "//")
		if path == "" {
			return nil, nil, errors.New("empty unix socket path")
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, nil, err
		}
		lis, err := net.Listen("unix", path)
		if err != nil {
			return nil, nil, err
		}
		// Group access, like the SDKs: the orchestrator container shares the group, not the user.
		if err := os.Chmod(path, 0o660); err != nil {
			lis.Close()
			return nil, nil, err
		}
		return lis, func() { os.Remove(path) }, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	return lis, func() {}, nil
}

// describeAddr is the bound address as a client would dial it (port 0 resolved).
func describeAddr(requested string, lis net.Listener) string {
	if strings.HasPrefix(requested, "unix:") {
		return requested
	}
	return lis.Addr().String()
}
