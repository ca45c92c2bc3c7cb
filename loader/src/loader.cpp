// conveyor::DataLoader: the public face of the engine (engine.h), plus errors, batches and the
// iterator.
#include "conveyor/loader.h"

#include "device_stager.h"
#include "engine.h"

namespace conveyor {

SampleError::SampleError(const std::string& message, size_t index, std::string path,
                         std::exception_ptr original)
    : std::runtime_error(message), index_(index), path_(std::move(path)), original_(original) {}

void Batch::record_stream(c10::Stream stream) const {
  if (copy_fence) copy_fence->use_on(stream, detail::fenced_tensors(*this, stream));
}

const at::Tensor& Batch::field(const std::string& name) const {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return fields[i];
  }
  throw std::out_of_range("Batch has no field '" + name + "'");
}

const at::Tensor& Batch::field_offsets(const std::string& name) const {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] != name) continue;
    if (i < offsets.size() && offsets[i].defined()) return offsets[i];
    throw std::out_of_range("Batch field '" + name + "' is not ragged: it has no offsets");
  }
  throw std::out_of_range("Batch has no field '" + name + "'");
}

DataLoader::DataLoader(std::shared_ptr<SampleSource> source, LoaderOptions options,
                       std::unique_ptr<Sampler> sampler, std::unique_ptr<CopyEngine> copy_engine)
    : impl_(std::make_unique<Impl>(std::move(source),
                                   detail::resolve_options(options, /*check_device=*/!copy_engine),
                                   std::move(sampler), std::move(copy_engine))) {}
DataLoader::DataLoader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DataLoader::~DataLoader() = default;

DataLoader::Iterator DataLoader::begin() {
  impl_->start_epoch();
  return Iterator(this, impl_->epoch(), impl_->runs());
}
std::optional<Batch> DataLoader::next() { return impl_->next(); }
DataLoader::Poll DataLoader::poll(std::chrono::milliseconds wait) { return impl_->poll(wait); }
void DataLoader::start_epoch() { impl_->start_epoch(); }
void DataLoader::set_epoch(uint64_t epoch) { impl_->set_epoch(epoch); }
void DataLoader::join() { impl_->join(); }
uint64_t DataLoader::epoch() const { return impl_->epoch(); }
size_t DataLoader::batches_per_epoch() const { return impl_->batches_per_epoch(); }
size_t DataLoader::workers() const { return impl_->workers(); }
const LoaderOptions& DataLoader::options() const { return impl_->options(); }
size_t DataLoader::pinned_bytes() const { return impl_->pinned_bytes(); }
bool DataLoader::is_pinned() const { return impl_->is_pinned(); }
std::string DataLoader::mode() const { return impl_->mode(); }
LoaderStats DataLoader::stats() const { return impl_->stats(); }

DataLoader::Iterator::Iterator(DataLoader* loader, uint64_t epoch, uint64_t run)
    : loader_(loader), epoch_(epoch), run_(run), batch_(loader->next()) {}

void DataLoader::Iterator::check_current() const {
  // By the loader's count of epoch starts and loads, not by epoch number: set_epoch(epoch())
  // then begin() starts the same epoch number again, and the old iterator must not walk it.
  if (loader_->impl_->runs() != run_) {
    throw std::logic_error("conveyor: this iterator belongs to epoch " + std::to_string(epoch_) +
                           ", which a later begin() or load() replaced");
  }
}

Batch& DataLoader::Iterator::operator*() {
  check_current();
  if (!batch_) throw std::out_of_range("conveyor: dereferenced the end of a DataLoader epoch");
  return *batch_;
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  check_current();
  if (!batch_) throw std::out_of_range("conveyor: incremented past the end of a DataLoader epoch");
  batch_.reset();  // release this batch's slot before waiting for the next
  batch_ = loader_->next();
  return *this;
}

std::unique_ptr<DataLoader> make_image_folder_loader(const std::string& root,
                                                     const ImageTransform& transform,
                                                     const LoaderOptions& options, bool shuffle) {
  std::shared_ptr<SampleSource> source = ImageSource::image_folder(root, transform);
  std::unique_ptr<Sampler> sampler =
      shuffle ? RandomSampler::make(options.seed) : SequentialSampler::make();
  return std::make_unique<DataLoader>(std::move(source), options, std::move(sampler));
}

}  // namespace conveyor
