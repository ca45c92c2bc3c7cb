// The file and memory kinds of ImageSource (sample_kind.h): image_folder and file_list read one
// local file per sample through the Storage; in_memory holds the bytes.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "conveyor/datasets.h"
#include "sources/sample_kind.h"

namespace conveyor {

namespace {

// One local file per sample, read through each worker's own StorageReader.
class FileKind final : public ImageSource::Kind {
 public:
  FileKind(std::vector<ImageItem> items, std::vector<std::string> classes,
           std::shared_ptr<const Storage> storage)
      : Kind(std::move(items), std::move(classes)), storage_(std::move(storage)) {}

  void prepare(size_t workers) override {
    while (readers_.size() < workers) readers_.push_back(storage_->reader(RemoteOptions{}));
  }

  void read(const SampleContext& ctx, detail::SampleMembers& out) override {
    const ImageItem& item = items_.at(ctx.index);
    read_file(*storage_, *readers_.at(ctx.worker), item.path, out.buffer);
    detail::image_members(out, out.buffer.data(), out.buffer.size(), item.label);
  }

 private:
  std::shared_ptr<const Storage> storage_;
  std::vector<std::unique_ptr<StorageReader>> readers_;  // one per worker
};

// Encoded images the source holds.
class MemoryKind final : public ImageSource::Kind {
 public:
  MemoryKind(std::vector<ImageItem> items, std::vector<std::vector<uint8_t>> jpegs)
      : Kind(std::move(items), {}), jpegs_(std::move(jpegs)) {}
  void prepare(size_t) override {}
  void read(const SampleContext& ctx, detail::SampleMembers& out) override {
    const std::vector<uint8_t>& jpeg = jpegs_.at(ctx.index);
    detail::image_members(out, jpeg.data(), jpeg.size(), items_[ctx.index].label);
  }

 private:
  std::vector<std::vector<uint8_t>> jpegs_;
};

std::shared_ptr<const Storage> storage_of(const FolderOptions& options) {
  return options.storage ? options.storage : system_storage();
}

// The extensions torchvision's ImageFolder lists (IMG_EXTENSIONS), in any case. A name only
// decides what is listed: each file is decoded by its content (codec/image_codec.h), so a PNG
// named .JPEG decodes as a PNG, and a format without a codec meets on_error, named.
constexpr const char* kImageExtensions[] = {".jpg", ".jpeg", ".png",  ".ppm", ".bmp",
                                            ".pgm", ".tif",  ".tiff", ".webp"};
constexpr const char* kImageExtensionList = ".jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp";

bool has_image_extension(const std::string& name) {
  std::string ext = std::filesystem::path(name).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return std::find(std::begin(kImageExtensions), std::end(kImageExtensions), ext) !=
         std::end(kImageExtensions);
}

// Every file named like an image below `folder` (following links to folders). Regular files and
// links are kept (a dangling link too, to be reported when read); folders named like images are
// looked into, not kept. A folder below the class folder that cannot be listed is skipped.
void find_images(const Storage& storage, const std::string& folder, bool top,
                 std::vector<std::string>& out) {
  std::vector<FolderEntry> entries;
  try {
    entries = storage.list_folder(folder);
  } catch (const std::runtime_error&) {
    if (top) throw;
    return;
  }
  for (const FolderEntry& entry : entries) {
    const std::string path = folder + "/" + entry.name;
    if (entry.folder) {
      find_images(storage, path, false, out);
    } else if (has_image_extension(entry.name)) {
      out.push_back(path);
    }
  }
}

}  // namespace

std::unique_ptr<ImageSource> ImageSource::image_folder(const std::filesystem::path& root,
                                                       ImageTransform transform,
                                                       const FolderOptions& options) {
  const std::shared_ptr<const Storage> storage = storage_of(options);
  std::vector<FolderEntry> entries;
  try {
    entries = storage->list_folder(root.string());
  } catch (const std::exception& e) {
    throw std::runtime_error("ImageFolder: " + root.string() + " is not a folder (" + e.what() +
                             ")");
  }
  std::vector<std::string> classes;
  for (const FolderEntry& entry : entries) {
    if (entry.folder) classes.push_back(entry.name);
  }
  std::sort(classes.begin(), classes.end());
  std::vector<ImageItem> items;
  for (size_t label = 0; label < classes.size(); ++label) {
    std::vector<std::string> files;
    find_images(*storage, (root / classes[label]).string(), true, files);
    std::sort(files.begin(), files.end());
    for (auto& f : files) items.push_back({std::move(f), static_cast<int64_t>(label)});
  }
  if (items.empty()) {
    throw std::runtime_error(std::string("ImageFolder: no images (") + kImageExtensionList +
                             ") in class folders under " + root.string());
  }
  return std::unique_ptr<ImageSource>(new ImageSource(
      std::make_unique<FileKind>(std::move(items), std::move(classes), storage), transform));
}

std::unique_ptr<ImageSource> ImageSource::file_list(const std::filesystem::path& list,
                                                    ImageTransform transform,
                                                    const FolderOptions& options) {
  const std::shared_ptr<const Storage> storage = storage_of(options);
  std::vector<uint8_t> bytes;
  try {
    if (!storage->reader(RemoteOptions{})
             ->read_whole({StorageLocation::Kind::kLocal, list.string()}, size_t{1} << 32, bytes)) {
      throw std::runtime_error("no such file");
    }
  } catch (const std::exception& e) {
    throw std::runtime_error("FileList: cannot open " + list.string() + " (" + e.what() + ")");
  }
  const std::string text(bytes.begin(), bytes.end());
  std::vector<ImageItem> items;
  size_t line_number = 0;
  const auto base = list.parent_path();
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const size_t tab = line.rfind('\t');
    auto bad = [&](const std::string& why) {
      return std::runtime_error("FileList: " + list.string() + ":" + std::to_string(line_number) +
                                ": " + why + " (expected 'path<TAB>label')");
    };
    if (tab == std::string::npos || tab == 0) throw bad("no tab-separated label");
    const std::string label_text = line.substr(tab + 1);
    char* label_end = nullptr;
    errno = 0;
    const long long label = std::strtoll(label_text.c_str(), &label_end, 10);
    if (errno != 0 || label_end == label_text.c_str() || *label_end != '\0' || label < 0) {
      throw bad("label '" + label_text + "' is not a non-negative integer");
    }
    std::filesystem::path path = line.substr(0, tab);
    if (path.is_relative()) path = base / path;
    items.push_back({path.string(), static_cast<int64_t>(label)});
  }
  if (items.empty()) throw std::runtime_error("FileList: " + list.string() + " lists no images");
  return std::unique_ptr<ImageSource>(new ImageSource(
      std::make_unique<FileKind>(std::move(items), std::vector<std::string>{}, storage),
      transform));
}

std::unique_ptr<ImageSource> ImageSource::in_memory(std::vector<std::vector<uint8_t>> jpegs,
                                                    std::vector<int64_t> labels,
                                                    ImageTransform transform) {
  if (jpegs.size() != labels.size()) {
    throw std::invalid_argument("in_memory: " + std::to_string(jpegs.size()) + " images but " +
                                std::to_string(labels.size()) + " labels");
  }
  std::vector<ImageItem> items;
  for (size_t i = 0; i < jpegs.size(); ++i) {
    items.push_back({"<memory #" + std::to_string(i) + ">", labels[i]});
  }
  return std::unique_ptr<ImageSource>(
      new ImageSource(std::make_unique<MemoryKind>(std::move(items), std::move(jpegs)), transform));
}

}  // namespace conveyor
