"""The web console of `dwsearch serve --console-port`: search, index and sweep pages for the
people who run and tune dwsearch, over this process's own gRPC services (dwsearch.console.app)."""
