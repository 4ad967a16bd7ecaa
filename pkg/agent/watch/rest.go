package watch

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
)

// scheme holds only the API groups the watches decode: client-go's
// kubernetes/scheme would link every group the API server serves.
var (
	scheme         = runtime.NewScheme()
	codecs         = serializer.NewCodecFactory(scheme)
	parameterCodec = runtime.NewParameterCodec(scheme)
)

func init() {
	utilruntime.Must(corev1.AddToScheme(scheme))
	utilruntime.Must(discoveryv1.AddToScheme(scheme))
	utilruntime.Must(networkingv1.AddToScheme(scheme))
	utilruntime.Must(metav1.AddMetaToScheme(scheme))
}

// Media types asked for. Protobuf first: decoding it costs a fraction of
// JSON's for the same objects, which matters when a relist brings every
// pod of the cluster; JSON for servers (and test stand-ins) without it.
const (
	acceptTyped    = "application/vnd.kubernetes.protobuf,application/json"
	acceptMetaList = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1," +
		"application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
	acceptMeta = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1," +
		"application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
)

// restClient is a client for the collections of gv whose watch events
// decode as item when they do not name their kind.
func restClient(cfg *rest.Config, gv schema.GroupVersion, item schema.GroupVersionKind) (*rest.RESTClient, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	if gv.Group == "" {
		c.APIPath = "/api"
	}
	c.AcceptContentTypes = acceptTyped
	c.ContentType = runtime.ContentTypeJSON
	c.NegotiatedSerializer = negotiated{NegotiatedSerializer: codecs.WithoutConversion(), item: item}
	// The reflectors' backoff paces the requests; a client-side limit
	// would only delay the relist after an outage (and Retry).
	c.QPS = -1
	return rest.RESTClientFor(c)
}

// negotiated is the codec factory's serializers, made lenient in two ways
// a real API server never needs and a minimal one (the test stand-ins,
// some proxies) does: JSON labelled text/plain is read as JSON, and a
// watch event's object that does not name its kind is taken as item.
type negotiated struct {
	runtime.NegotiatedSerializer
	item schema.GroupVersionKind
}

func (n negotiated) SupportedMediaTypes() []runtime.SerializerInfo {
	infos := append([]runtime.SerializerInfo(nil), n.NegotiatedSerializer.SupportedMediaTypes()...)
	for _, i := range infos {
		if i.MediaType == runtime.ContentTypeJSON {
			i.MediaType, i.MediaTypeType, i.MediaTypeSubType = "text/plain", "text", "plain"
			return append(infos, i)
		}
	}
	return infos
}

func (n negotiated) DecoderToVersion(d runtime.Decoder, gv runtime.GroupVersioner) runtime.Decoder {
	return kindDefaulter{Decoder: n.NegotiatedSerializer.DecoderToVersion(d, gv), item: n.item}
}

// kindDefaulter decodes an object without kind as item, when nothing else
// says what it is (a watch event's object; a list has its target type).
type kindDefaulter struct {
	runtime.Decoder
	item schema.GroupVersionKind
}

func (k kindDefaulter) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if defaults == nil && into == nil {
		defaults = &k.item
	}
	return k.Decoder.Decode(data, defaults, into)
}
