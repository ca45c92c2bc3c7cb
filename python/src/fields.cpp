// conveyor._C's named fields (conveyor/fields.h): Field, and the sources made of fields (shards
// and manifests). python/conveyor/fields.py builds the public classes on these.
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"

namespace conveyor::python {
namespace {

// The one reading of an Array's dtype name (python/conveyor/fields.py's _DTYPES gives them).
c10::ScalarType dtype_named(const std::string& name) {
  static const std::map<std::string, c10::ScalarType> kNames = {
      {"bool", c10::ScalarType::Bool},     {"uint8", c10::ScalarType::Byte},
      {"int8", c10::ScalarType::Char},     {"int16", c10::ScalarType::Short},
      {"int32", c10::ScalarType::Int},     {"int64", c10::ScalarType::Long},
      {"float16", c10::ScalarType::Half},  {"bfloat16", c10::ScalarType::BFloat16},
      {"float32", c10::ScalarType::Float}, {"float64", c10::ScalarType::Double},
      {"uint16", c10::ScalarType::UInt16}};
  const auto found = kNames.find(name);
  if (found == kNames.end()) throw std::invalid_argument("conveyor: no dtype named " + name);
  return found->second;
}

Fields to_fields(const std::vector<std::pair<std::string, Field>>& fields) {
  return Fields(fields.begin(), fields.end());
}

std::unique_ptr<Source> field_source(std::unique_ptr<FieldSource> made) {
  return std::make_unique<Source>(std::shared_ptr<SampleSource>(std::move(made)), nullptr);
}

}  // namespace

void bind_fields(py::module_& m) {
  m.attr("DEFAULT_IMAGE_KEYS") = Field::kDefaultImageKeys;
  m.attr("PER_VIEW_SUFFIX") = Field::kPerViewSuffix;
  py::class_<Field>(m, "Field")
      .def_static(
          "image",
          [](std::string keys, const ImageTransform& transform, ImageOutput::Mode mode,
             const std::string& dtype) {
            ImageOutput output;
            output.mode = mode;
            output.dtype = dtype_named(dtype);
            return Field::image(std::move(keys), transform, output);
          },
          py::arg("keys"), py::arg("transform"), py::arg("mode"), py::arg("dtype"))
      .def_static("integer", &Field::integer, py::arg("keys"))
      .def_static("floating", &Field::floating, py::arg("keys"))
      .def_static(
          "array",
          [](std::string keys, const std::string& dtype, std::vector<int64_t> shape, bool multi_hot,
             size_t max_bytes) {
            Field f =
                Field::array(std::move(keys), dtype_named(dtype), std::move(shape), max_bytes);
            f.multi_hot = multi_hot;
            return f;
          },
          py::arg("keys"), py::arg("dtype"), py::arg("shape"), py::arg("multi_hot"),
          py::arg("max_bytes"))
      .def_static("bytes", &Field::bytes, py::arg("keys"), py::arg("max_bytes"))
      .def_static("text", &Field::text, py::arg("keys"), py::arg("max_bytes"))
      .def_static("json", &Field::json, py::arg("keys"), py::arg("max_bytes"))
      .def_static(
          "mask",
          [](std::string keys, std::string follows, const std::string& dtype) {
            return Field::mask(std::move(keys), std::move(follows), dtype_named(dtype));
          },
          py::arg("keys"), py::arg("follows"), py::arg("dtype"))
      .def_static(
          "boxes",
          [](std::string keys, std::string follows, std::vector<std::string> paired,
             double min_size, double min_visibility, size_t max_bytes) {
            BoxRule rule;
            rule.min_size = min_size;
            rule.min_visibility = min_visibility;
            return Field::boxes(std::move(keys), std::move(follows), std::move(paired), rule,
                                max_bytes);
          },
          py::arg("keys"), py::arg("follows"), py::arg("paired"), py::arg("min_size"),
          py::arg("min_visibility"), py::arg("max_bytes"))
      .def_static("points", &Field::points, py::arg("keys"), py::arg("follows"), py::arg("columns"),
                  py::arg("max_bytes"))
      .def_static("plan", &Field::plan, py::arg("follows"));

  m.def(
      "manifest",
      [](const std::string& path, const std::vector<std::pair<std::string, Field>>& fields,
         const std::string& format) {
        ManifestOptions options;
        if (format == "csv") {
          options.format = ManifestOptions::Format::kCsv;
        } else if (format == "tsv") {
          options.format = ManifestOptions::Format::kTsv;
        } else if (format == "jsonl") {
          options.format = ManifestOptions::Format::kJsonLines;
        } else if (!format.empty()) {
          throw std::invalid_argument(
              "conveyor: Manifest format must be 'csv', 'tsv' or "
              "'jsonl' (or None: from the extension), not '" +
              format + "'");
        }
        py::gil_scoped_release released;
        return field_source(FieldSource::manifest(path, to_fields(fields), options));
      },
      py::arg("path"), py::arg("fields"), py::arg("format"));

  m.def(
      "field_tar_shards",
      [](const std::vector<std::string>& shards, bool literal,
         const std::vector<std::pair<std::string, Field>>& fields, const ShardOptions& options) {
        py::gil_scoped_release released;
        if (!literal)
          return field_source(FieldSource::tar_shards(shards, to_fields(fields), options));
        std::vector<ShardLocation> locations;
        for (const std::string& s : shards) locations.push_back(literal_shard_location(s));
        return field_source(FieldSource::tar_shards(locations, to_fields(fields), options));
      },
      py::arg("shards"), py::arg("literal"), py::arg("fields"), py::arg("options"));
}

}  // namespace conveyor::python
