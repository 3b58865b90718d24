// Command dwsearch-client-check builds against the Go stubs generated from protos/ and
// constructs a client for every dwsearch.v1 service, so that CI proves the Go team can
// compile against them (`bash go/stubs.sh check`). Without -addr it lists each service
// and its RPCs; with -addr it also asks that server's grpc.health.v1 service about each
// service it hosts (health needs no bearer token).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/reflect/protoreflect"

	dwsearchv1 "dwsearch/gen/go/dwsearch/v1"
)

func main() {
	addr := flag.String("addr", "", "host:port of a dwsearch process to health-check (optional)")
	timeout := flag.Duration("timeout", 5*time.Second, "deadline of each health check")
	flag.Parse()

	target := *addr
	if target == "" {
		// Dialling is lazy: constructing clients needs no server.
		target = "dwsearch.invalid:50051"
	}
	conn, err := grpc.Dial(target, grpc.WithInsecure())
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		os.Exit(1)
	}
	defer conn.Close()

	// One file per service; the descriptor names it and its RPCs.
	services := []struct {
		file   protoreflect.FileDescriptor
		client interface{}
	}{
		{dwsearchv1.File_dwsearch_v1_search_proto, dwsearchv1.NewSearchServiceClient(conn)},
		{dwsearchv1.File_dwsearch_v1_sweep_proto, dwsearchv1.NewSweepServiceClient(conn)},
		{dwsearchv1.File_dwsearch_v1_index_proto, dwsearchv1.NewIndexServiceClient(conn)},
		{dwsearchv1.File_dwsearch_v1_embedder_proto, dwsearchv1.NewEmbedderServiceClient(conn)},
		{dwsearchv1.File_dwsearch_v1_reranker_proto, dwsearchv1.NewRerankerServiceClient(conn)},
	}
	names := make([]string, 0, len(services))
	for _, s := range services {
		if s.file.Services().Len() != 1 {
			fmt.Fprintf(os.Stderr, "%s: expected one service, found %d\n", s.file.Path(), s.file.Services().Len())
			os.Exit(1)
		}
		sd := s.file.Services().Get(0)
		names = append(names, string(sd.FullName()))
		fmt.Printf("%s (%T):", sd.FullName(), s.client)
		for i := 0; i < sd.Methods().Len(); i++ {
			m := sd.Methods().Get(i)
			suffix := ""
			if m.IsStreamingServer() || m.IsStreamingClient() {
				suffix = "(stream)"
			}
			fmt.Printf(" %s%s", m.Name(), suffix)
		}
		fmt.Println()
	}
	if *addr == "" {
		return
	}

	health := healthpb.NewHealthClient(conn)
	failed := false
	for _, name := range names {
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
		cancel()
		switch {
		case err != nil:
			// NOT_FOUND: that process does not host this service.
			fmt.Printf("health %s: %v\n", name, err)
		default:
			fmt.Printf("health %s: %s\n", name, resp.GetStatus())
			failed = failed || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING
		}
	}
	if failed {
		os.Exit(1)
	}
}
