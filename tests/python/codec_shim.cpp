// placeholder, replaced by the formats helper
extern "C" int flamia_codec_shim_version() { return 1; }
