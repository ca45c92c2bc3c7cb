// per_field(): a pipeline per image field or view group (conveyor/augment.h), each run on a batch
// of that field alone, named "image": a view group's views as rows, or one view at a time.
#include <algorithm>
#include <utility>

#include <ATen/ATen.h>

#include "conveyor/augment.h"

namespace conveyor {
namespace {

constexpr const char* kImage = "image";  // the name the field's ops see it under

// The field's op stream: the parent's, mixed with the field's name (FNV-1a, stable everywhere).
uint64_t field_stream(uint64_t op, const std::string& field) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char c : field) h = (h ^ c) * 0x100000001b3ull;
  return splitmix64(op ^ splitmix64(h));
}

std::string spec_text(const FieldSpec& f) {
  return std::string(c10::toString(f.dtype)) + " " + c10::str(at::IntArrayRef(f.sample_shape));
}

class PerField final : public BatchOp {
 public:
  explicit PerField(std::vector<FieldPipeline> pipelines) : pipelines_(std::move(pipelines)) {
    for (size_t i = 0; i < pipelines_.size(); ++i) {
      const FieldPipeline& p = pipelines_[i];
      if (p.per_view.empty()) {
        throw std::invalid_argument("conveyor: per_field: field \"" + p.field + "\" has no op");
      }
      for (const auto& op : p.per_view) {
        if (!op)
          throw std::invalid_argument("conveyor: per_field: a null op for \"" + p.field + "\"");
      }
      for (size_t j = 0; j < i; ++j) {
        if (pipelines_[j].field == p.field) {
          throw std::invalid_argument("conveyor: per_field: field \"" + p.field +
                                      "\" is given twice");
        }
      }
    }
  }

  std::string name() const override {
    std::string text = "PerField({";
    for (size_t i = 0; i < pipelines_.size(); ++i) {
      const FieldPipeline& p = pipelines_[i];
      text += (i ? ", \"" : "\"") + p.field + "\": ";
      if (p.per_view.size() == 1) {
        text += p.per_view[0]->name();
        continue;
      }
      text += "[";
      for (size_t v = 0; v < p.per_view.size(); ++v)
        text += (v ? ", " : "") + p.per_view[v]->name();
      text += "]";
    }
    return text + "})";
  }

  std::vector<FieldSpec> out_fields(std::vector<FieldSpec> in) const override {
    for (const FieldPipeline& p : pipelines_) {
      FieldSpec& f = in[BatchFields{in, {}}.find(p.field)];
      const Shape shape = shape_of(f, p);
      FieldSpec image{kImage, f.dtype, shape.image};
      std::vector<FieldSpec> out;
      for (size_t v = 0; v < p.per_view.size(); ++v) {
        std::vector<FieldSpec> made = p.per_view[v]->out_fields({image});
        if (made.size() != 1 || made[0].name != kImage) {
          throw std::invalid_argument("per_field: the op for field \"" + p.field +
                                      "\" adds, removes or renames fields");
        }
        if (v > 0 &&
            (made[0].dtype != out[0].dtype || made[0].sample_shape != out[0].sample_shape)) {
          throw std::invalid_argument("per_field: the ops of view group \"" + p.field +
                                      "\" make different images: view 0 " + spec_text(out[0]) +
                                      ", view " + std::to_string(v) + " " + spec_text(made[0]));
        }
        out.push_back(std::move(made[0]));
      }
      f.dtype = out[0].dtype;
      f.sample_shape = out[0].sample_shape;
      if (shape.views > 0) f.sample_shape.insert(f.sample_shape.begin(), shape.views);
    }
    return in;
  }

  void apply(BatchFields& batch, const BatchContext& ctx) const override {
    for (const FieldPipeline& p : pipelines_) {
      const FieldSpec spec = batch.spec(p.field);
      const Shape shape = shape_of(spec, p);
      at::Tensor& images = batch[p.field];
      BatchContext field_ctx = ctx;
      field_ctx.op = field_stream(ctx.op, p.field);
      FieldRecord* record = nullptr;
      if (ctx.record != nullptr) {
        ctx.record->fields.push_back({p.field, std::max<size_t>(shape.views, 1), {}});
        record = &ctx.record->fields.back();
        record->draws.rows.resize(ctx.rows() * record->views);
      }
      if (shape.views == 0) {
        images = run(*p.per_view[0], spec.dtype, shape.image, images, field_ctx,
                     record ? &record->draws : nullptr);
      } else if (p.per_view.size() == 1) {
        images = run_flat(*p.per_view[0], spec.dtype, shape, images, field_ctx, record);
      } else {
        images = run_per_view(p, spec.dtype, shape, images, field_ctx, record);
      }
    }
  }

 private:
  struct Shape {
    int64_t views = 0;           // 0: a plain image field
    std::vector<int64_t> image;  // one image's shape
  };

  static Shape shape_of(const FieldSpec& f, const FieldPipeline& p) {
    Shape shape;
    if (f.sample_shape.size() == 4) {
      shape.views = f.sample_shape[0];
      shape.image.assign(f.sample_shape.begin() + 1, f.sample_shape.end());
    } else {
      shape.image = f.sample_shape;
    }
    image_layout({f.name, f.dtype, shape.image}, "per_field");  // throws for a non-image field
    const auto views = static_cast<size_t>(shape.views);
    if (p.per_view.size() != 1 && p.per_view.size() != views) {
      throw std::invalid_argument(
          "per_field: field \"" + p.field + "\" " +
          (shape.views == 0 ? "is one image a sample, so it takes 1 op"
                            : "is a view group of " + std::to_string(views) +
                                  " views, so it takes 1 op or " + std::to_string(views)) +
          ", not " + std::to_string(p.per_view.size()));
    }
    return shape;
  }

  // Runs `op` on `images` [rows, ...image] as the batch {"image"}; returns the result.
  static at::Tensor run(const BatchOp& op, c10::ScalarType dtype, const std::vector<int64_t>& image,
                        const at::Tensor& images, const BatchContext& ctx, AugmentRecord* record) {
    BatchFields one;
    one.specs = {FieldSpec{kImage, dtype, image}};
    one.tensors = {images};
    BatchContext c = ctx;
    c.record = record;
    apply_op(op, one, c);
    return std::move(one.tensors[0]);
  }

  // Writes `out` back into `into` when the op kept the images' dtype and shape (so the slot keeps
  // its tensor, as for an op working in place), else returns it as the field's new tensor.
  static at::Tensor keep(at::Tensor into, const at::Tensor& out) {
    if (out.scalar_type() != into.scalar_type() || out.numel() != into.numel()) return out;
    const at::Tensor shaped = out.reshape_as(into);
    if (!(shaped.data_ptr() == into.data_ptr() && shaped.strides() == into.strides())) {
      into.copy_(shaped);
    }
    return into;
  }

  // A view group with one op: its B * V views as rows.
  static at::Tensor run_flat(const BatchOp& op, c10::ScalarType dtype, const Shape& shape,
                             at::Tensor& images, BatchContext ctx, FieldRecord* record) {
    const int64_t rows = images.size(0), views = shape.views;
    std::vector<int64_t> flat{rows * views};
    flat.insert(flat.end(), shape.image.begin(), shape.image.end());
    BatchContext c = ctx;
    c.indices.clear();
    c.repeats.clear();
    c.views.clear();
    for (size_t r = 0; r < ctx.rows(); ++r) {
      for (int64_t v = 0; v < views; ++v) {
        c.indices.push_back(ctx.indices[r]);
        if (!ctx.repeats.empty()) c.repeats.push_back(ctx.repeats.at(r));
        c.views.push_back(static_cast<uint32_t>(v));
      }
    }
    const at::Tensor out =
        run(op, dtype, shape.image, images.reshape(flat), c, record ? &record->draws : nullptr);
    std::vector<int64_t> grouped{rows, views};
    grouped.insert(grouped.end(), out.sizes().begin() + 1, out.sizes().end());
    if (out.scalar_type() == images.scalar_type() &&
        out.sizes().slice(1) == images.sizes().slice(2)) {
      return keep(images, out);
    }
    return out.reshape(grouped);
  }

  // A view group with an op per view: view v's B images through per_view[v].
  static at::Tensor run_per_view(const FieldPipeline& p, c10::ScalarType dtype, const Shape& shape,
                                 at::Tensor& images, const BatchContext& ctx, FieldRecord* record) {
    at::Tensor result;  // a new tensor, once an op makes other images than it was given
    for (int64_t v = 0; v < shape.views; ++v) {
      BatchContext c = ctx;
      c.view = static_cast<uint32_t>(v);
      c.views.clear();
      AugmentRecord drawn;
      if (record != nullptr) drawn.rows.resize(ctx.rows());
      const at::Tensor slice = images.select(1, v);
      const at::Tensor out = run(*p.per_view[static_cast<size_t>(v)], dtype, shape.image, slice, c,
                                 record ? &drawn : nullptr);
      const bool same = out.scalar_type() == slice.scalar_type() && out.sizes() == slice.sizes();
      if (same && !result.defined()) {
        keep(slice, out);
      } else {
        if (!result.defined()) {
          std::vector<int64_t> grouped{images.size(0), shape.views};
          grouped.insert(grouped.end(), out.sizes().begin() + 1, out.sizes().end());
          result = at::empty(grouped, out.options());
        }
        result.select(1, v).copy_(out);
      }
      if (record != nullptr) {
        for (size_t r = 0; r < ctx.rows(); ++r) {
          record->draws.rows[r * static_cast<size_t>(shape.views) + static_cast<size_t>(v)] =
              std::move(drawn.rows[r]);
        }
        for (DrawnParam& d : drawn.batch) record->draws.batch.push_back(std::move(d));
      }
    }
    return result.defined() ? result : images;
  }

  std::vector<FieldPipeline> pipelines_;
};

}  // namespace

std::shared_ptr<const BatchOp> per_field(std::vector<FieldPipeline> pipelines) {
  return std::make_shared<const PerField>(std::move(pipelines));
}

}  // namespace conveyor
