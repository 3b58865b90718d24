// Command dwsearch-client-check builds against the Go stubs generated from protos/ and
// constructs a client for every dwsearch.v1 service, so that CI proves the Go team can
// compile against them (`bash go/stubs.sh check`). Without -addr it lists each service
// and its RPCs; with -addr it also asks that server's grpc.health.v1 service about each
// service it hosts (health needs no bearer token). With -org and -query as well, it runs
// one Search the way the digitalworker module would (search below) and prints the hits;
// with -org and -similar-message or -similar-window, one Similar (similar below).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/reflect/protoreflect"

	dwsearchv1 "dwsearch/gen/go/dwsearch/v1"
)

func main() {
	addr := flag.String("addr", "", "host:port of a dwsearch process to health-check (optional)")
	timeout := flag.Duration("timeout", 5*time.Second, "deadline of each health check")
	org := flag.String("org", "", "with -addr and -query: the org to search")
	query := flag.String("query", "", "with -addr and -org: run one hybrid Search and print its hits")
	contextMessages := flag.Uint("context", 0, "with -query: messages before and after each hit to print (0..20)")
	newest := flag.Bool("newest", false, "with -query: sort the hits newest first (SEARCH_SORT_NEWEST)")
	fusion := flag.String("fusion", "", "with -query: rrf or weighted (SearchRequest.fusion); empty = the server's default")
	weights := flag.String("weights", "", "with -query: per-leg fusion weights, e.g. fts=0.5,dense=1 (SearchRequest.fusion_weights)")
	similarMessage := flag.String("similar-message", "", "with -addr and -org: run Similar from this dw_chat_events id and print its hits")
	similarWindow := flag.String("similar-window", "", "with -addr and -org: run Similar from this window id and print its hits")
	explain := flag.Bool("explain", false, "with -query or -similar-*: print each hit's explanation and the stage times")
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
	if *org != "" && *query != "" {
		order := dwsearchv1.SearchSort_SEARCH_SORT_RELEVANCE
		if *newest {
			order = dwsearchv1.SearchSort_SEARCH_SORT_NEWEST
		}
		fused, err := fusionOptions(*fusion, *weights)
		if err != nil {
			fmt.Fprintln(os.Stderr, "search:", err)
			os.Exit(2)
		}
		if err := search(dwsearchv1.NewSearchServiceClient(conn), *org, *query, uint32(*contextMessages), order, fused, *explain); err != nil {
			fmt.Fprintln(os.Stderr, "search:", err)
			os.Exit(1)
		}
	}
	if *org != "" && (*similarMessage != "" || *similarWindow != "") {
		request := &dwsearchv1.SimilarRequest{
			OrgId:           *org,
			MessageId:       *similarMessage,
			WindowId:        *similarWindow,
			Limit:           5,
			ContextMessages: uint32(*contextMessages),
			Explain:         *explain,
		}
		if err := similar(dwsearchv1.NewSearchServiceClient(conn), request); err != nil {
			fmt.Fprintln(os.Stderr, "similar:", err)
			os.Exit(1)
		}
	}
}

// callContext is every call's context: a deadline, the bearer token
// (DWSEARCH_AUTH_TOKEN) as metadata, and the caller's W3C trace context as the
// traceparent header. In the digitalworker module otelgrpc's client interceptor sends
// that header from the current span; here it comes from TRACEPARENT, OpenTelemetry's
// name for trace context carried in the environment. serve continues that trace.
func callContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if token := os.Getenv("DWSEARCH_AUTH_TOKEN"); token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	if parent := os.Getenv("TRACEPARENT"); parent != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", parent)
	}
	return ctx, cancel
}

// fusion is how Search should fuse its legs: a method and per-leg weights (both optional).
type fusion struct {
	method  dwsearchv1.SearchFusion
	weights map[string]float32
}

// fusionOptions parses -fusion and -weights ("fts=0.5,dense=1,dense:MODEL=2"); the server
// checks the keys and values (INVALID_ARGUMENT).
func fusionOptions(method, weights string) (fusion, error) {
	f := fusion{weights: map[string]float32{}}
	switch method {
	case "":
	case "rrf":
		f.method = dwsearchv1.SearchFusion_SEARCH_FUSION_RRF
	case "weighted":
		f.method = dwsearchv1.SearchFusion_SEARCH_FUSION_WEIGHTED
	default:
		return f, fmt.Errorf("-fusion %q: rrf or weighted", method)
	}
	for _, entry := range strings.Split(weights, ",") {
		if strings.TrimSpace(entry) == "" {
			continue
		}
		at := strings.LastIndex(entry, "=")
		if at < 0 {
			return f, fmt.Errorf("-weights %q: expected source=weight", entry)
		}
		value, err := strconv.ParseFloat(strings.TrimSpace(entry[at+1:]), 32)
		if err != nil {
			return f, fmt.Errorf("-weights %q: %v", entry, err)
		}
		f.weights[strings.TrimSpace(entry[:at])] = float32(value)
	}
	return f, nil
}

// search calls Search as the digitalworker module should: a deadline on every call, the
// bearer token (DWSEARCH_AUTH_TOKEN) as metadata, and a degraded answer treated as an
// answer — full-text hits with the reason stated, never an error when full text can answer.
func search(client dwsearchv1.SearchServiceClient, org, query string, contextMessages uint32, order dwsearchv1.SearchSort, fused fusion, explain bool) error {
	ctx, cancel := callContext()
	defer cancel()
	resp, err := client.Search(ctx, &dwsearchv1.SearchRequest{
		OrgId: org,
		Query: query,
		Limit: 5,
		Mode:  dwsearchv1.SearchMode_SEARCH_MODE_HYBRID,
		// Messages around each hit, to show the conversation; 0 for none.
		ContextMessages: contextMessages,
		Sort:            order,
		// Unspecified and empty: the server's DWSEARCH_FUSION and DWSEARCH_FUSION_WEIGHTS.
		Fusion:        fused.method,
		FusionWeights: fused.weights,
		// Each hit's legs and fused score, and the stages' times; off by default.
		Explain: explain,
	})
	if err != nil {
		// INVALID_ARGUMENT: a bad request (empty query, limit over 100, ...), not retryable.
		// UNAVAILABLE: the server or its database is down; retry with backoff.
		return err
	}
	fmt.Printf("search %q in %s: mode %s, model %q, fusion %s, %d hits\n", query, org, resp.GetMode(), resp.GetModel(),
		resp.GetFusion(), len(resp.GetHits()))
	for _, d := range resp.GetDegradations() {
		fmt.Printf("  degraded: %s (%s)\n", d.GetReason(), d.GetDetail())
	}
	for _, c := range resp.GetTypoCorrections() {
		// Full text found nothing as typed: this word was widened to these.
		fmt.Printf("  typo: %s -> %s\n", c.GetTerm(), strings.Join(c.GetCorrections(), ", "))
	}
	printHits(resp.GetHits(), resp.GetStageTimes())
	return nil
}

// similar calls Similar: the org's closed windows most like one conversation (a message's
// or a window's), the conversation's own windows left out. NOT_FOUND: no such message or
// window in the org; FAILED_PRECONDITION: semantic search is off for the org.
func similar(client dwsearchv1.SearchServiceClient, request *dwsearchv1.SimilarRequest) error {
	ctx, cancel := callContext()
	defer cancel()
	resp, err := client.Similar(ctx, request)
	if err != nil {
		return err
	}
	c := resp.GetConversation()
	fmt.Printf("similar in %s: conversation %s %s %s..%s, model %q, fusion %s, embedded now %v, %d hits\n",
		request.GetOrgId(), c.GetProvider(), c.GetExternalChannelId(), c.GetStartTime().AsTime().Format(time.RFC3339),
		c.GetEndTime().AsTime().Format(time.RFC3339), resp.GetModel(), resp.GetFusion(), resp.GetEmbeddedModels(),
		len(resp.GetHits()))
	for _, d := range resp.GetDegradations() {
		fmt.Printf("  degraded: %s (%s)\n", d.GetReason(), d.GetDetail())
	}
	printHits(resp.GetHits(), resp.GetStageTimes())
	return nil
}

// printHits prints Search's and Similar's hits the same way, with their explanations
// and the stage times when the call asked to explain.
func printHits(hits []*dwsearchv1.SearchHit, stages []*dwsearchv1.SearchStageTime) {
	for i, h := range hits {
		text := []rune(strings.ReplaceAll(h.GetText(), "\n", " / "))
		if len(text) > 80 {
			text = append(text[:80], []rune("...")...)
		}
		fmt.Printf("  %d. %s %s score %.4f (fts #%d, dense #%d, sparse #%d) %d messages: %s\n",
			i+1, h.GetKind(), h.GetExternalChannelId(), h.GetScore(), h.GetFts().GetRank(),
			h.GetDense().GetRank(), h.GetSparse().GetRank(), len(h.GetMessageIds()), string(text))
		// Highlight offsets are in code points: index the text as runes.
		runes := []rune(h.GetText())
		marks := make([]string, 0, len(h.GetHighlights()))
		for _, span := range h.GetHighlights() {
			if int(span.GetEnd()) <= len(runes) && span.GetStart() < span.GetEnd() {
				marks = append(marks, fmt.Sprintf("[%s]", string(runes[span.GetStart():span.GetEnd()])))
			}
		}
		// Every leg that found the hit (each active model's dense leg among them), sorted.
		legs := make([]string, 0, len(h.GetSources()))
		for source, s := range h.GetSources() {
			legs = append(legs, fmt.Sprintf("%s #%d (%.3f)", source, s.GetRank(), s.GetScore()))
		}
		sort.Strings(legs)
		if len(legs) > 0 {
			fmt.Printf("     legs: %s\n", strings.Join(legs, ", "))
		}
		if len(marks) > 0 {
			fmt.Printf("     highlights: %s\n", strings.Join(marks, " "))
		}
		for _, m := range h.GetContextBefore() {
			fmt.Printf("     before %s: %s\n", m.GetCreatedAt().AsTime().Format(time.RFC3339), m.GetText())
		}
		for _, m := range h.GetContextAfter() {
			fmt.Printf("     after %s: %s\n", m.GetCreatedAt().AsTime().Format(time.RFC3339), m.GetText())
		}
		if e := h.GetExplanation(); e != nil {
			// The fused score is the sum of weight x normalised over the legs.
			parts := make([]string, 0, len(e.GetLegs()))
			for _, leg := range e.GetLegs() {
				parts = append(parts, fmt.Sprintf("%s #%d raw %.4f norm %.4f x %.2f", leg.GetLeg(), leg.GetRank(),
					leg.GetRawScore(), leg.GetNormalizedScore(), leg.GetWeight()))
			}
			fmt.Printf("     explain: fused %.6f = %s", e.GetFusedScore(), strings.Join(parts, " + "))
			if e.RerankScore != nil {
				fmt.Printf("; rerank %.4f", e.GetRerankScore())
			}
			fmt.Println()
		}
	}
	for _, s := range stages {
		fmt.Printf("  stage %s: %s\n", s.GetStage(), s.GetDuration().AsDuration())
	}
}
