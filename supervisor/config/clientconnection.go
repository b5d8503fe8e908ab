package config

// Content types of the API client: protobuf is what kube-proxy asks for by default; it
// is several times smaller and cheaper to decode than JSON for Services and
// EndpointSlices, which every node lists and watches.
const (
	ContentTypeProtobuf = "application/vnd.kubernetes.protobuf"
	ContentTypeJSON     = "application/json"
)

// kube-proxy's defaults for its clientConnection.
const (
	DefaultClientQPS   float32 = 5
	DefaultClientBurst int32   = 10
)

// ClientConnection configures the supervisor's API client, as kube-proxy's
// clientConnection does (its kubeconfig is the top-level kubeconfig here).
type ClientConnection struct {
	// QPS is the steady rate of requests to the API server the client allows
	// (token bucket). Default 5, as kube-proxy.
	QPS float32 `yaml:"qps"`
	// Burst is how many requests may go at once above QPS. Default 10, as kube-proxy.
	Burst int32 `yaml:"burst"`
	// ContentType is what the client sends and asks for: protobuf (default, as
	// kube-proxy) or application/json.
	ContentType string `yaml:"contentType"`
	// AcceptContentTypes is the Accept header; default: ContentType, then JSON (for
	// resources the server has no protobuf for).
	AcceptContentTypes string `yaml:"acceptContentTypes"`
}

// Default fills every unset field with kube-proxy's default: QPS 5, burst 10, protobuf
// with JSON as the fallback. The supervisor's and the node address writer's clients both
// take their settings from a defaulted ClientConnection.
func (cc *ClientConnection) Default() {
	if cc.QPS == 0 {
		cc.QPS = DefaultClientQPS
	}
	if cc.Burst == 0 {
		cc.Burst = DefaultClientBurst
	}
	if cc.ContentType == "" {
		cc.ContentType = ContentTypeProtobuf
	}
	if cc.AcceptContentTypes == "" {
		cc.AcceptContentTypes = cc.ContentType
		if cc.ContentType != ContentTypeJSON {
			cc.AcceptContentTypes += "," + ContentTypeJSON
		}
	}
}

func (cc *ClientConnection) validate(p *problems) {
	if cc.QPS < 0 {
		p.add("clientConnection.qps", "%v is negative", cc.QPS)
	}
	if cc.Burst < 0 {
		p.add("clientConnection.burst", "%d is negative", cc.Burst)
	}
	if cc.ContentType != ContentTypeProtobuf && cc.ContentType != ContentTypeJSON {
		p.add("clientConnection.contentType", "%q is not %s or %s", cc.ContentType, ContentTypeProtobuf, ContentTypeJSON)
	}
	if cc.QPS > 0 && float32(cc.Burst) < cc.QPS {
		p.add("clientConnection.burst", "%d is below qps %v: the client could not reach its rate", cc.Burst, cc.QPS)
	}
}
